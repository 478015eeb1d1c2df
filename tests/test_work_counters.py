"""Work counters on fixed tiny-model traces, compared with recorded values (000 §6.1; issue 19).

Timings are noise on a loaded CI machine; the work the engine does is not: tokens computed,
forward passes, tokens generated, KV cells in use, bytes saved and stored. The agent trace of
tests/test_tier1_combinations.py (tiny words model, greedy) runs with every Tier-1 switch off and
on; its counters must equal tests/work_counters.json. A change that makes the engine do more
work (or less) fails here, on purpose: if the change is deliberate, re-record with

    PYLLAMAOPT_RECORD_COUNTERS=1 pytest tests/test_work_counters.py

and commit the new file with the change that explains it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pyllamaopt import Context, Model, OptConfig
from test_tier1_combinations import SWITCHES, WORDS_CALL, trace, words_encoder
from tinymodel import write_tiny_llama

RECORDED = Path(__file__).resolve().parent / "work_counters.json"
COUNTERS = ("tokens_prefilled", "tokens_decoded", "tokens_generated", "forward_passes", "dedup_tokens_saved",
            "diff_tokens_unchanged", "diff_tokens_recomputed", "canon_bytes_saved", "memo_lookups", "memo_hits",
            "memo_tokens_skipped", "schema_tokens_skipped", "persist_saves", "persist_tokens_restored")


def counters(model: Model, prompts: dict[str, list[list[int]]], persist_dir: Path, on: bool) -> dict[str, int]:
    """The trace of test_tier1_combinations.run (agent turns, every other one under a grammar; a
    second agent; a fork; a restart that restores from disk), counted: the statistics summed over
    both contexts, the KV cells in use and the dedup pool's blocks at the end of each, the bytes
    of the entries stored on disk."""
    # the disk tier written on close, as recorded: written behind, what a background writer merges
    # depends on timing (tests/test_persist_write_behind.py)
    # and every memo draft checked: the gate follows timings (docs/memo.md)
    config = OptConfig(env={}, persist_dir=str(persist_dir), persist_write_behind=False, memo_gate=False,
                       **dict.fromkeys(SWITCHES, on))
    total = dict.fromkeys(COUNTERS, 0)
    cells, pool = [], []

    def turn(session, prompt, constrained):
        session.sync(prompt)
        list(session.generate(10, **({"grammar": WORDS_CALL} if constrained else {})))

    def add(ctx):
        for name in COUNTERS:
            total[name] += getattr(ctx.stats, name)
        cells.append(ctx.kv_cells_used)
        pool.append(ctx.pool_blocks)

    with Context(model, n_ctx=16384, n_batch=256, n_seq_max=4, n_threads=1, config=config) as ctx:
        agent = ctx.session()
        for i, prompt in enumerate(prompts["agent"]):
            turn(agent, prompt, i % 2 == 1)
        turn(ctx.session(), prompts["other"][0], True)
        fork = agent.fork()
        turn(fork, fork.tokens + prompts["fork"][0], False)
        add(ctx)
    with Context(model, n_ctx=16384, n_batch=256, n_seq_max=4, n_threads=1, config=config) as ctx:
        turn(ctx.session(), prompts["agent"][-1], True)
        add(ctx)
    total["kv_cells_used"] = sum(cells)
    total["pool_blocks"] = sum(pool)
    # the stored entries only: the directory's file-hashes memo holds the model's path, whose length
    # is pytest's (pytest-99 vs pytest-110 changed the total by a byte)
    total["persist_bytes"] = sum(f.stat().st_size for f in persist_dir.rglob("*.llkv"))
    return total


@pytest.mark.slow
def test_work_counters_equal_the_recorded_ones(tmp_path):
    model = Model(write_tiny_llama(tmp_path / "words.gguf", characters=False))
    prompts = trace(6, words_encoder(model))
    got = {name: counters(model, prompts, tmp_path / name, on) for name, on in (("all_off", False), ("all_on", True))}
    if os.environ.get("PYLLAMAOPT_RECORD_COUNTERS") == "1":
        RECORDED.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
        pytest.skip(f"recorded {RECORDED.name}: commit it with the change that explains it")
    recorded = json.loads(RECORDED.read_text())
    changed = [f"{run}.{name}: recorded {recorded[run].get(name)}, now {value}"
               for run, values in got.items() for name, value in values.items() if recorded[run].get(name) != value]
    assert not changed, ("the engine's work changed:\n  " + "\n  ".join(changed) +
                         "\nIf deliberate, re-record: PYLLAMAOPT_RECORD_COUNTERS=1 pytest tests/test_work_counters.py")
    # the trace exercises what it counts: with the switches on the engine computes less
    assert got["all_on"]["tokens_prefilled"] < got["all_off"]["tokens_prefilled"]
    assert got["all_on"]["persist_tokens_restored"] > 0 and got["all_on"]["memo_tokens_skipped"] > 0
