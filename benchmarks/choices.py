"""OpenAI's n: one request with n choices against n requests of one choice each, side by side.

    python benchmarks/choices.py [--model gemma3-270m] [--threads 2] [--n 2 4] [--tokens 64] [--rounds 5]

One `pyllamaopt serve` process; a prompt of about 300 tokens (new in every round: nothing cached from the
round before), sampled at temperature 1 with a seed. Per n and round, in turn: (a) one /v1/completions
request with n choices, (b) a new prompt as n requests one after the other, choice i's with seed + i
(what the choices are: the texts of the same prompt with n choices are checked equal to them), the first
computing the prompt, the others finding its blocks. Printed per n: the median wall time of each and
their ratio; the server process's CPU time (all its threads: on a loaded machine wall times say more
about the kernel's scheduler than about the work) and its ratio; the prompt tokens computed by each (n
choices fork the prompt's session: each fork computes only the prompt's last chunk) and the completion
tokens. The choices' decode steps are batched (one forward pass for the n rows), the requests' are not.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from served import serve, thread_cpu_seconds  # noqa: E402

WORDS = ("river market bridge castle harbour scholar winter trade salt amber cloth tower street garden field "
         "bell mill forest road letter").split()


def prompt(round_: int) -> str:
    """About 300 tokens of text, different in every round (its first words name the round)."""
    words = [WORDS[(round_ * 7 + i * i) % len(WORDS)] for i in range(220)]
    return f"Round {round_}. " + " ".join(words)


def complete(url: str, text: str, n: int, seed: int, tokens: int) -> dict:
    body = {"prompt": text, "max_tokens": tokens, "n": n, "temperature": 1.0, "seed": seed}
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=1200) as r:
        return json.loads(r.read())


def timed(pid: int, work: Callable[[], list[dict]]) -> tuple[float, float, list[dict]]:
    """Wall seconds, the server's CPU seconds, and the answers of `work()`."""
    cpu, started = sum(thread_cpu_seconds(pid).values()), time.perf_counter()
    answers = work()
    return time.perf_counter() - started, sum(thread_cpu_seconds(pid).values()) - cpu, answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, serve(args.model, "--threads", str(args.threads),
                                                     log=Path(tmp) / "server.log") as server:
        print(f"{'n':>3} {'wall: choices s':>15} {'requests s':>10} {'ratio':>6} {'CPU: choices s':>14} "
              f"{'requests s':>10} {'ratio':>6} {'computed: choices':>17} {'requests':>8} {'completion':>10}")
        pid, round_ = server.process.pid, 0
        for n in args.n:
            rows = []
            for _ in range(args.rounds):
                round_ += 2  # (two prompts of their own: the separate requests compute theirs cold too)
                alone, text = prompt(round_ - 1), prompt(round_)
                together = timed(pid, lambda: [complete(server.url, alone, n, 7, args.tokens)])
                apart = timed(pid, lambda: [complete(server.url, text, 1, 7 + i, args.tokens) for i in range(n)])
                same = complete(server.url, text, n, 7, args.tokens)
                assert [c["text"] for c in same["choices"]] == [a["choices"][0]["text"] for a in apart[2]], \
                    "n choices differ from n requests with seed + i"
                rows.append((together[0], apart[0], together[1], apart[1],
                             together[2][0]["pyllamaopt"]["computed_tokens"],
                             sum(a["pyllamaopt"]["computed_tokens"] for a in apart[2]),
                             together[2][0]["usage"]["completion_tokens"]))
            wall_a, wall_b, cpu_a, cpu_b = (statistics.median(r[k] for r in rows) for k in range(4))
            computed_a, computed_b, completion = rows[-1][4:]
            print(f"{n:>3} {wall_a:>15.2f} {wall_b:>10.2f} {wall_a / wall_b:>6.2f} {cpu_a:>14.2f} {cpu_b:>10.2f} "
                  f"{cpu_a / cpu_b:>6.2f} {computed_a:>17} {computed_b:>8} {completion:>10}", flush=True)


if __name__ == "__main__":
    main()
