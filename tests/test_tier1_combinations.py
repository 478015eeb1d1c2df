"""Every combination of the Tier-1 switches — dedup, diff, canon, memo, schema skip, persist —
gives the same tokens as all of them off, and bitwise the same logits, on agent-trace turns
(spec 000 §6.4; benchmarks/agent_trace_data.py).

The trace, as a client sends it: each turn re-sends the conversation (earlier answers lose
their reasoning block, so the re-sent text changes: the diff keeps only the common prefix) and
the session syncs to it and generates, every other turn under a grammar (schema skip). A second
agent shares the system prompt (dedup, and canon for the blocks it computes again), a fork goes
on from the first, and after the context closes (persist: saved) a new context syncs to the last
prompt (persist: restored). Every switch must have done work in the combinations that turn it
on, or the comparison would prove nothing about it.

All 64 combinations on the tiny words-only model: a grammar forces single tokens only on a
vocabulary without single-character tokens (docs/structured-output.md), so the trace's words are
mapped one to one onto its vocabulary (a fixed hash: the trace's repetitions and edits stay
what they are). On Gemma 3 270M, with the trace's real tokens and the tool-call JSON Schema, all
off against all on and all on but the diff (schema skip never finds a forced token there: the
same document).
"""
from __future__ import annotations

import itertools
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from pyllamaopt import Context, Model, OptConfig
from tinymodel import write_tiny_llama

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import agent_trace_data as data  # noqa: E402

SWITCHES = ("dedup_enabled", "diff_enabled", "canon_enabled", "memo_enabled", "schema_skip_enabled", "persist_enabled")
# what each switch does when on, as the statistics count it
WORK = {"dedup_enabled": "dedup_tokens_saved", "diff_enabled": "diff_tokens_unchanged",
        "canon_enabled": "canon_entries_deduped", "memo_enabled": "memo_tokens_skipped",
        "schema_skip_enabled": "schema_tokens_skipped", "persist_enabled": "persist_tokens_restored"}
TOOL_CALL = {"type": "object", "properties": {
    "tool": {"enum": ["read_file", "edit_file", "run_tests", "search"]},
    "arguments": {"type": "object", "properties": {"path": {"type": "string", "maxLength": 12}}, "required": ["path"]}},
    "required": ["tool", "arguments"]}
# a tool call in the words model's vocabulary: six forced tokens, two choices (tests/test_structured.py)
WORDS_CALL = r'''root ::= "the" " code" (" file" | " test") " will" " return" " a" " value" (" paris" | " python")'''


def trace(n_turns: int, encode) -> dict[str, list[list[int]]]:
    """The prompts: the agent's turns, another agent's first turn, and what the fork appends."""
    system, turns, other = data.system_prompt(), data.turns(n_turns), data.session_task(1)
    return {"agent": [encode(data.render(system, turns[:i], turns[i], shape="reasoning")) for i in range(n_turns)],
            "other": [encode(data.render(system, [], other[0], shape="append"))],
            "fork": [encode(" Thanks. Now run the tests again.")[1:]]}  # (without the BOS put first)


def words_encoder(model: Model):
    """The trace's text as the words model's tokens: each whitespace-separated word onto one word
    of the vocabulary, by a fixed hash."""
    words = [t for t in range(model.n_vocab) if model.token_bytes(t).startswith(b" ")]
    return lambda text: [model.bos_token] + [words[zlib.crc32(w.encode()) % len(words)] for w in text.split()]


def run(model, prompts, persist_dir: Path, constraint: dict, n_threads: int, n_gen: int, **switches: bool):
    """Everything the trace computes: every generation's tokens and the logits after every
    prompt, and the statistics of both contexts."""
    # every memo draft checked (the gate follows timings: docs/memo.md), so that WORK is counted
    config = OptConfig(env={}, persist_dir=str(persist_dir), memo_gate=False, **switches)
    outputs: list = []
    stats = []

    def turn(session, prompt, constrained):
        session.sync(prompt)
        outputs.append(session.logits())
        outputs.append([t.id for t in session.generate(n_gen, **(constraint if constrained else {}))])

    with Context(model, n_ctx=16384, n_batch=256, n_seq_max=4, n_threads=n_threads, config=config) as ctx:
        agent = ctx.session()
        for i, prompt in enumerate(prompts["agent"]):
            turn(agent, prompt, i % 2 == 1)
        other = ctx.session()
        turn(other, prompts["other"][0], True)
        fork = agent.fork()
        turn(fork, fork.tokens + prompts["fork"][0], False)
        for s in (agent, other, fork):
            assert s.invariant_violation is None
        stats.append(ctx.stats)
    with Context(model, n_ctx=16384, n_batch=256, n_seq_max=4, n_threads=n_threads, config=config) as ctx:
        turn(ctx.session(), prompts["agent"][-1], True)  # after a restart
        stats.append(ctx.stats)
    return outputs, stats


def assert_same(outputs, reference, name):
    assert len(outputs) == len(reference)
    for i, (got, want) in enumerate(zip(outputs, reference)):
        if isinstance(want, np.ndarray):
            assert np.array_equal(got, want), f"{name}: logits after prompt {i // 2} differ"
        else:
            assert got == want, f"{name}: generation {i // 2} gave {got}, all-off gave {want}"


def check_combinations(model, prompts, tmp_path, combinations, constraint, expect_work, n_threads, n_gen):
    """Returns each switch's work (its counter) in each combination that turns it on."""
    run_trace = lambda name, **switches: run(model, prompts, tmp_path / name, constraint,  # noqa: E731
                                             n_threads, n_gen, **switches)
    reference, _ = run_trace("off", **dict.fromkeys(SWITCHES, False))
    did: dict[str, list[int]] = {s: [] for s in SWITCHES}
    for combination in combinations:
        switches = dict(zip(SWITCHES, combination))
        name = "+".join(s.removesuffix("_enabled") for s, on in switches.items() if on) or "off"
        outputs, stats = run_trace(name, **switches)
        assert_same(outputs, reference, name)
        for switch, counter in WORK.items():
            work = sum(getattr(s, counter) for s in stats)
            assert switches[switch] or work == 0, f"{name}: {counter} = {work} with {switch} off"
            if switches[switch]:
                did[switch].append(work)
    assert all(sum(did[s]) > 0 for s in expect_work), f"a switch never did any work: {did}"
    return did


def print_work(did: dict[str, list[int]]) -> None:
    """The table of docs/reliability.md (shown by pytest -s)."""
    print("\n| switch | counter | combinations with it on | doing work | work: total (min–max) |")
    print("|---|---|---|---|---|")
    for switch, works in did.items():
        print(f"| {switch.removesuffix('_enabled')} | `{WORK[switch]}` | {len(works)} | {sum(w > 0 for w in works)} | "
              f"{sum(works):,} ({min(works, default=0):,}–{max(works, default=0):,}) |")


@pytest.mark.slow
def test_every_combination_of_tier1_switches_gives_the_all_off_tokens(tmp_path):
    words_model = Model(write_tiny_llama(tmp_path / "words.gguf", characters=False))
    prompts = trace(6, words_encoder(words_model))
    print_work(check_combinations(words_model, prompts, tmp_path, list(itertools.product((False, True), repeat=6)),
                                  {"grammar": WORDS_CALL}, SWITCHES, n_threads=1, n_gen=10))


@pytest.mark.integration
@pytest.mark.slow
def test_tier1_switches_all_on_give_the_all_off_tokens_on_gemma(gemma, tmp_path):
    """All on, and all on but the diff (so that the others meet whole prompts): 3 turns, as each
    run with the diff off computes every prompt whole (about 10,000 tokens)."""
    prompts = trace(3, lambda text: gemma.tokenize(text, special=True))
    all_on, but_diff = (True,) * 6, tuple(s != "diff_enabled" for s in SWITCHES)
    print_work(check_combinations(gemma, prompts, tmp_path, [all_on, but_diff], {"json_schema": TOOL_CALL},
                                  [s for s in SWITCHES if s != "schema_skip_enabled"], n_threads=2, n_gen=8))
