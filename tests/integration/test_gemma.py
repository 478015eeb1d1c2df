"""The real model, Gemma 3 270M: metadata, generation, long prompts past the sliding window,
bad input, GIL release, and parity with upstream llama.cpp built from the same source."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from pyllamaopt import Context, ContextOverflowError, InvalidTokenError

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Q: What is the boiling point of water at sea level?\nA:",
    "<start_of_turn>user\nWrite a haiku about the sea.<end_of_turn>\n<start_of_turn>model\n",
]


@pytest.fixture(scope="module")
def upstream_bin() -> Path:
    sys.path.insert(0, str(ROOT / "tools"))
    import build_upstream

    return build_upstream.build(("llama-simple-opt-numerics",))


def test_metadata(gemma):
    assert gemma.architecture == "gemma3"
    assert gemma.n_layer == 18
    assert gemma.n_vocab == 262144
    assert (gemma.n_head, gemma.n_head_kv) == (4, 1)
    assert gemma.n_swa == 512
    assert gemma.chat_template is None
    assert gemma.tokenize("Hello") == [2, 9259]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_output_equals_upstream_llama_cpp(gemma, gemma_path, upstream_bin, prompt):
    """llama.cpp's own examples/simple (greedy, flash attention auto = on for CPU), run with the
    two numerics settings our patches add (tools/upstream/opt-numerics.cpp), and pyllamaopt print
    the same bytes for the same model, prompt and length: tokenizer, prefill, decode and sampling
    are upstream's. (Against the stock program a near-tie greedy token can differ:
    docs/exactness.md, "Against upstream llama.cpp".)"""
    n_predict = 48
    result = subprocess.run([str(upstream_bin / "llama-simple-opt-numerics"), "-m", str(gemma_path), "-n", str(n_predict), prompt],
                            capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]

    with Context(gemma, n_ctx=1024, n_threads=2) as ctx:
        session = ctx.session()
        prompt_tokens = gemma.tokenize(prompt, add_bos=True, special=True)
        session.append(prompt_tokens)
        generated = [t.id for t in session.generate(n_predict)]
    if generated and gemma.is_eog(generated[-1]):
        generated = generated[:-1]  # llama-simple stops without printing the end token
    ours = b"".join(gemma.token_bytes(t, special=True) for t in prompt_tokens + generated) + b"\n"
    assert ours == result.stdout


def test_long_prompt_beyond_the_sliding_window(gemma):
    text = " ".join(f"Line {i}: the value of item {i} is {i * 7 % 13}." for i in range(120))
    prompt = gemma.tokenize(text + "\nQuestion: what is the value of item 3? Answer:")
    assert len(prompt) > 1500  # three times the 512-token window of the SWA layers
    with Context(gemma, n_ctx=4096, n_threads=2) as ctx:
        first = ctx.session()
        first.append(prompt)
        assert first.stats.forward_passes == -(-len(prompt) // 512)
        logits = first.logits()
        answer = first.generate_text(8)
        assert answer.strip(), "the model answers something"
        first.close()
        # a new session on the freed cells recomputes exactly the same thing
        second = ctx.session()
        second.append(prompt)
        np.testing.assert_array_equal(second.logits(), logits)
        assert second.generate_text(8) == answer


def test_bad_input_on_the_real_model(gemma):
    with Context(gemma, n_ctx=256, n_threads=2) as ctx:
        session = ctx.session()
        with pytest.raises(InvalidTokenError, match="262143"):
            session.append([2, 262144])
        with pytest.raises(ContextOverflowError):
            session.append([2] * (ctx.n_ctx + 1))
        assert session.tokens == []
        session.append_text("Hello")
        assert len(session.generate_text(4)) > 0


def test_the_gil_is_released_while_llama_cpp_computes(gemma):
    text = "word " * 1500
    with Context(gemma, n_ctx=2048, n_threads=1) as ctx:
        session = ctx.session()
        ticks, done = [0], threading.Event()

        def count():
            while not done.is_set():
                ticks[0] += 1
                time.sleep(0.001)

        counter = threading.Thread(target=count)
        counter.start()
        start = time.perf_counter()
        session.append_text(text)
        elapsed = time.perf_counter() - start
        done.set()
        counter.join()
    assert elapsed > 0.3
    assert ticks[0] > elapsed * 1000 * 0.3, "another Python thread kept running during the prefill"


def test_the_readmes_api_snippet_runs_as_written(tmp_path, capsys):
    """A newcomer copies README.md's "The API in a few lines" and runs it: it ran into names it
    never defined. Run as written, the second turn computes only what is new."""
    import re

    text = (ROOT / "README.md").read_text()
    code = re.search(r"## The API in a few lines\n\n```python\n(.*?)```", text, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    computed, total = map(int, re.search(r"(\d+) of (\d+) tokens computed", out).groups())
    assert 0 < computed < total / 2
