"""Log-probabilities through the OpenAI routes (issue 43, item 4), driven by the real `openai`
client against a server process: a completion's (Gemma 3 270M) and a chat completion's (SmolLM2)
values are bitwise the in-process library's for the same tokens, streamed or not; with echo, the
prompt's are the prompt's own computation, bitwise a fresh context's whether the server had the
prompt's prefix cached or not; and those values are the log-softmax of the model's logits."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from pyllamaopt import ChatTemplate, Context, Model, TokenLogprob
from pyllamaopt.chat import prompt_tokens
from test_serve import N_CTX, Server, start_server, stop_server

pytestmark = pytest.mark.integration

# a prompt of more than one canonical chunk (512 tokens) on Gemma 3
LONG = ("The history of the printing press begins in the fifteenth century. "
        + " ".join(f"Chapter {i} tells how the workshop number {i} set its type and inked its plates." for i in range(40)))


@pytest.fixture(scope="module")
def gemma_server(gemma_path, tmp_path_factory) -> Iterator[Server]:
    s = start_server(gemma_path, tmp_path_factory.mktemp("logprobs"))
    yield s
    stop_server(s)


def fresh_score(model: Model, tokens: list[int], top: int) -> list[TokenLogprob | None]:
    """The reference: a fresh context that never saw anything, every position computed."""
    with Context(model, n_ctx=N_CTX, n_threads=2) as ctx:
        return ctx.session().score(tokens, top_logprobs=top)


def fresh_generation(model: Model, tokens: list[int], n: int, top: int) -> list[tuple[int, TokenLogprob | None]]:
    with Context(model, n_ctx=N_CTX, n_threads=2) as ctx:
        session = ctx.session()
        session.append(tokens)
        return [(t.id, t.logprob) for t in session.generate(n, logprobs=top)]


def completion_lists(model: Model, pairs: list[tuple[int, TokenLogprob | None]]) -> dict[str, list[Any]]:
    """What the completions route must answer for these tokens (OpenAI's lists, from offset 0)."""
    out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": []}
    for token, lp in pairs:
        text = model.token_bytes(token).decode("utf-8", errors="replace")
        out["tokens"].append(text)
        out["token_logprobs"].append(None if lp is None else lp.logprob)
        if lp is None:
            out["top_logprobs"].append(None)
        else:
            top = {model.token_bytes(t).decode("utf-8", errors="replace"): v for t, v in lp.top}
            top.setdefault(text, lp.logprob)
            out["top_logprobs"].append(top)
    return out


def lists_of(logprobs: Any) -> dict[str, list[Any]]:
    return {"tokens": logprobs.tokens, "token_logprobs": logprobs.token_logprobs, "top_logprobs": logprobs.top_logprobs}


def test_a_prompts_logprobs_are_the_log_softmax_of_its_logits(gemma):
    """Session.score's values against NumPy's log-softmax of the logits after each prefix (each
    computed by a session of its own: rows of another product size, so equal to ~1e-4, not bitwise)."""
    tokens = gemma.tokenize("The capital of France is Paris, and the capital of Italy is Rome.")
    scored = fresh_score(gemma, tokens, 3)
    assert scored[0] is None and len(scored) == len(tokens)
    with Context(gemma, n_ctx=N_CTX, n_threads=2) as ctx:
        for i in range(1, len(tokens)):
            session = ctx.session()
            session.append(tokens[:i])
            logits = session.logits().astype(np.float64)
            session.close()
            log_softmax = logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
            got = scored[i]
            assert got is not None and got.token == tokens[i]
            assert got.logprob == pytest.approx(log_softmax[tokens[i]], abs=2e-3)
            best = np.argsort(-log_softmax, kind="stable")[:3]
            assert [t for t, _ in got.top][:1] == [int(best[0])]
            assert [v for _, v in got.top] == sorted((v for _, v in got.top), reverse=True)
            assert got.top[0][1] == pytest.approx(log_softmax[best[0]], abs=2e-3)


def test_what_outputting_every_row_changes(gemma):
    """The measurement behind Session.score's design (docs/exactness.md, "Echo"): llama.cpp
    selects the output rows before the last layer's FFN, so a chunk that outputs every row runs that
    FFN and the output layer as a product of the chunk's size, not of one row. The logits of a row
    can then differ from the same row's as the last of a plain prefill (measured: by a few 1e-6 on
    Gemma 3), but for a prompt of at most 16 tokens (patches/0006: such a batch computes each row
    like a decode step, however many rows it outputs). Whether a given longer prompt's row differs
    follows the CPU's kernels (on an AVX2 machine the 700-token prompt's came out bitwise equal, the
    200-token one's not; on an AVX-512 one both differed): some longer prompt's does. The KV does not
    change: after scoring, the session generates the plain prompt's tokens with its logits bit for bit."""
    differs = {}
    for n in (12, 200, 700):
        tokens = gemma.tokenize(LONG)[:n - 1]
        with Context(gemma, n_ctx=N_CTX, n_threads=2) as ctx:
            plain = ctx.session()
            plain.append(tokens)
            logits = plain.logits()
            generated = list(plain.generate(6, logprobs=20))
            first = generated[0].logprob
            assert first is not None
            scored = ctx.session().score(tokens + [first.token], top_logprobs=20)[-1]
            assert scored is not None and scored.logprob == pytest.approx(first.logprob, abs=1e-3)
            differs[n] = scored != first
            again = ctx.session()
            again.score(tokens)
            assert np.array_equal(again.logits(), logits)
            assert [(t.id, t.logprob) for t in again.generate(6, logprobs=20)] == [(t.id, t.logprob) for t in generated]
    assert not differs[12] and (differs[200] or differs[700]), differs


def test_echo_logprobs_equal_a_fresh_context_cold_and_warm_bitwise(gemma_server, gemma):
    client = gemma_server.client()
    prompt = gemma.tokenize(LONG)
    assert len(prompt) > 600
    ref = fresh_score(gemma, prompt, 5)
    expected = completion_lists(gemma, list(zip(prompt, ref)))

    def echo(tokens: list[int], **fields: Any) -> Any:
        return client.completions.create(model="m", prompt=tokens, max_tokens=0, echo=True, logprobs=5, **fields)

    cold = echo(prompt)
    assert cold.choices[0].text == gemma.detokenize(prompt) and cold.choices[0].finish_reason == "length"
    assert lists_of(cold.choices[0].logprobs) == expected
    assert cold.choices[0].logprobs.text_offset[:3] == [0, len(expected["tokens"][0]),
                                                        len(expected["tokens"][0]) + len(expected["tokens"][1])]

    # warm: the prompt's prefix is cached by a plain completion (reused: it says so), then echoed
    longer = prompt + gemma.tokenize(" The end of the book.", add_bos=False)
    plain = client.completions.create(model="m", prompt=longer, max_tokens=2)
    again = client.completions.create(model="m", prompt=longer, max_tokens=2)
    assert again.usage.prompt_tokens_details.cached_tokens >= 512, again.usage  # the prefix was there
    assert again.choices[0].text == plain.choices[0].text
    assert lists_of(echo(prompt).choices[0].logprobs) == expected
    warm_longer = echo(longer)
    assert lists_of(warm_longer.choices[0].logprobs) == completion_lists(
        gemma, list(zip(longer, fresh_score(gemma, longer, 5))))

    streamed = list(echo(prompt, stream=True))
    assert streamed[0].choices[0].text == gemma.detokenize(prompt)
    assert lists_of(streamed[0].choices[0].logprobs) == expected


def test_generated_logprobs_equal_the_librarys_streamed_or_not(gemma_server, gemma):
    client = gemma_server.client()
    prompt = gemma.tokenize("Here is a list of fruits: apple, banana,")
    generated = fresh_generation(gemma, prompt, 8, 3)
    expected = completion_lists(gemma, generated)
    whole = client.completions.create(model="m", prompt=prompt, max_tokens=8, logprobs=3)
    assert lists_of(whole.choices[0].logprobs) == expected
    assert whole.choices[0].logprobs.text_offset[0] == 0
    chunks = [c for c in client.completions.create(model="m", prompt=prompt, max_tokens=8, logprobs=3, stream=True)
              if c.choices and c.choices[0].logprobs is not None]
    assert {k: [x for c in chunks for x in getattr(c.choices[0].logprobs, k)] for k in expected} == expected

    # echo with an answer: the prompt's own values, then the answer's, which echo does not change
    both = client.completions.create(model="m", prompt=prompt, max_tokens=8, logprobs=3, echo=True)
    assert both.choices[0].text == gemma.detokenize(prompt) + whole.choices[0].text
    assert lists_of(both.choices[0].logprobs) == completion_lists(
        gemma, list(zip(prompt, fresh_score(gemma, prompt, 3))) + generated)
    # lm-eval's loglikelihood request: echo, logprobs 1, max_tokens 1 (or 0)
    lm = client.completions.create(model="m", prompt=prompt, max_tokens=1, logprobs=1, echo=True, temperature=0)
    assert len(lm.choices[0].logprobs.token_logprobs) == len(prompt) + 1


@pytest.fixture(scope="module")
def smollm2_server(smollm2_path, tmp_path_factory) -> Iterator[Server]:
    s = start_server(smollm2_path, tmp_path_factory.mktemp("logprobs-smollm2"))
    yield s
    stop_server(s)


@pytest.mark.parametrize("top", [0, 4])
def test_chat_logprobs_equal_the_librarys_streamed_or_not(smollm2_server, smollm2_path, top):
    model = Model(str(smollm2_path))
    messages = [{"role": "user", "content": "Name three colours."}]
    template = ChatTemplate.for_model(model)
    tokens = prompt_tokens(model, template, messages, template.render(messages))
    generated = fresh_generation(model, tokens, 12, top)
    expected = []
    for token, lp in generated:
        assert lp is not None
        raw = model.token_bytes(token)
        expected.append({"token": raw.decode("utf-8", errors="replace"), "logprob": lp.logprob, "bytes": list(raw),
                         "top_logprobs": [{"token": model.token_bytes(t).decode("utf-8", errors="replace"),
                                           "logprob": v, "bytes": list(model.token_bytes(t))} for t, v in lp.top]})
    client = smollm2_server.client()
    fields: dict[str, Any] = {"top_logprobs": top} if top else {}
    whole = client.chat.completions.create(model="m", messages=messages, max_tokens=12, logprobs=True, **fields)
    content = whole.choices[0].logprobs.content
    assert [c.model_dump() for c in content] == expected
    assert "".join(c.token for c in content) == whole.choices[0].message.content
    streamed = [entry.model_dump() for chunk in client.chat.completions.create(
                    model="m", messages=messages, max_tokens=12, logprobs=True, stream=True, **fields)
                for choice in chunk.choices if choice.logprobs is not None for entry in choice.logprobs.content or []]
    assert streamed == expected
    plain = client.chat.completions.create(model="m", messages=messages, max_tokens=12)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == whole.choices[0].message.content
