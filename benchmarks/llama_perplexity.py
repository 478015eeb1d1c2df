"""llama.cpp's own quality measure: its llama-perplexity tool (tools/build_upstream.py: the same pinned
tree and CPU flags as pyllamaopt) on one text, with cache types K/V one after another.

The first pair is the base: its run saves its log-probabilities (--kl-divergence-base); every pair,
the base's too (llama.cpp's noise floor: 0 if its runs repeat), then runs --kl-divergence against
them and reports perplexity, the mean KL(base || pair) per scored token and the share of scored
tokens whose most likely next token is the base's ("Same top p").

Scoring: llama-perplexity cuts its input into chunks of -c tokens, computes each from an empty cache
and scores only the second half of each chunk (every scored token then has at least half a chunk
before it). Here the chunk is the whole text: -c is its token count, so every token of the text's
second half is scored with everything before it, as in a conversation. The tool wants at least two
chunks of input: the file holds the text three times and --chunks 1 scores the first. It tokenizes the
file as plain text (special-token text such as "<start_of_turn>" is not parsed), so its tokens of
chat markup differ from those of a Session given the same text with special tokens; the tokens it
scored are read back from the base file and checked against the Model's plain tokenization.
The base file (in a temporary folder, removed at the end) holds 2 bytes per vocabulary entry and
scored token: about 1.2 GB for Gemma 3's 262k vocabulary and 2,355 tokens.
"""
from __future__ import annotations

import re
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

from pyllamaopt import Model  # noqa: E402

COPIES = 3  # of the text in the tool's input file: at least two chunks of -c tokens (the copies after the
            # first have no BOS, and the file's last newline is dropped)


@dataclass
class Scores:
    ppl: float
    kl: float    # mean KL(base || this) per scored token
    top1: float  # share of scored tokens whose most likely next token is the base's
    scored: int  # tokens scored


def chunk_tokens(model: Model, text: str) -> int:
    """-c: the tokens of `text` as llama-perplexity reads them from a file holding it more than once
    (a token the copies share at their seam, if any, is left out)."""
    alone = model.tokenize(text, add_bos=True)
    repeated = model.tokenize(text * COPIES, add_bos=True)
    return next((i for i, (a, b) in enumerate(zip(alone, repeated)) if a != b), len(alone))


def scores(model: Model, text: str, cache_types: dict[str, tuple[str, str]], threads: int) -> Iterator[tuple[str, Scores]]:
    """(label, Scores) for each entry of cache_types (label -> (K's type, V's type)), the first the base."""
    import build_upstream

    tool = build_upstream.build(("llama-perplexity",)) / "llama-perplexity"
    n_ctx = chunk_tokens(model, text)
    with tempfile.TemporaryDirectory(prefix="llama-perplexity-") as tmp:
        text_file, base_file = Path(tmp) / "text.txt", Path(tmp) / "base.logits"
        text_file.write_text(text * COPIES)

        def run(k: str, v: str, *mode: str) -> str:
            # -b n_ctx: the chunk in one batch (no second copy of its logits; ubatches as by default)
            command = [str(tool), "-m", model.path, "-c", str(n_ctx), "-b", str(n_ctx), "-t", str(threads),
                       "-fa", "on", "--swa-full", "-ctk", k, "-ctv", v, "--chunks", "1", *mode]
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
            return result.stdout + result.stderr

        base_k, base_v = next(iter(cache_types.values()))
        out = run(base_k, base_v, "-f", str(text_file), "--kl-divergence-base", str(base_file))
        check_tokens(base_file, model.tokenize(text, add_bos=True)[:n_ctx], out)
        for label, (k, v) in cache_types.items():
            out = run(k, v, "--kl-divergence", "--kl-divergence-base", str(base_file))
            yield label, Scores(ppl=figure(out, r"Mean PPL\(Q\)\s*:\s*(\S+)"), kl=figure(out, r"Mean\s+KLD:\s*(\S+)"),
                                top1=figure(out, r"Same top p:\s*(\S+)") / 100, scored=n_ctx - 1 - n_ctx // 2)


def check_tokens(base_file: Path, expected: list[int], output: str) -> None:
    """The tokens the base run scored (its file: "_logits_", n_ctx, n_vocab, n_chunk, the tokens)."""
    with base_file.open("rb") as f:
        header, tokens = f.read(20), f.read(4 * len(expected))
    if len(tokens) < 4 * len(expected) or header[:8] != b"_logits_":
        raise SystemExit(f"llama-perplexity saved no base of {len(expected)} tokens:\n{output[-3000:]}")
    if list(struct.unpack(f"<{len(expected)}i", tokens)) != expected:
        raise SystemExit("llama-perplexity scored other tokens than the text's plain tokenization")


def figure(output: str, pattern: str) -> float:
    match = re.search(pattern, output)
    if match is None:
        raise SystemExit(f"llama-perplexity printed no {pattern!r}:\n{output[-3000:]}")
    return float(match.group(1))
