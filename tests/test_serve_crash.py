"""`kill -9` of `pyllamaopt serve` with the disk tier on (issue 42): 20 kills at points drawn by a
seeded RNG (mid-prefill: right after a request is sent; mid-generation: in the middle of a stream;
mid-write: while the disk tier's writer has a file open), each followed by a restart on the same
directory. The restarted server must have on disk every prompt whose prefill finished
FLUSH_INTERVAL before the kill (a request for it again restores its blocks: the answer's
`pyllamaopt.restored_tokens`), answer every prompt, token for token, as a server with persistence
off does (greedy and seeded sampling, streamed and not), and never hold a wrong entry (every
entry's checksums sound, its tokens a prefix of a prompt that was sent)."""
from __future__ import annotations

import collections
import contextlib
import importlib
import importlib.util
import math
import os
import random
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from pyllamaopt import PersistStore
from test_serve import Server, start_server, stop_server

# What a request cut by the kill raises: openai's APIError, or (a stream cut in some openai
# versions, e.g. 3.3) its HTTP library's transport error, not wrapped
CUT_BY_THE_KILL = (openai.APIError,) + tuple(importlib.import_module(name).TransportError
                                             for name in ("httpx", "httpx2") if importlib.util.find_spec(name))

SEED = 20261128
KILLS = 20
BLOCK = 64
FLUSH_INTERVAL = 1.0     # what the write-behind promises: a prompt prefilled this long before a kill is on disk
# one thread: a tiny model's forward pass is shorter than two threads' barrier on a loaded machine
SERVER_ARGS = ("--n-ctx", "4096", "--threads", "1")
SYSTEM_TOKENS = 4 * BLOCK + 17  # the system prompt every request starts with: several blocks and a partial one
KILL_POINTS = ("mid-prefill", "mid-generation", "mid-write")
TMP_PREFIX = ".tmp-"     # an entry being written (docs/persist-format.md)


@dataclass(frozen=True)
class Ask:
    """One completion request: greedy, or sampled with a seed."""
    prompt: tuple[int, ...]
    max_tokens: int
    stream: bool
    seed: int | None = None

    def send(self, client: openai.OpenAI) -> Any:  # a completion, or a stream of chunks
        sampling = {"temperature": 0} if self.seed is None else {"temperature": 0.8, "top_p": 0.95, "seed": self.seed}
        usage = {"stream_options": {"include_usage": True}} if self.stream else {}
        return client.completions.create(model="m", prompt=list(self.prompt), max_tokens=self.max_tokens,
                                         stream=self.stream, **usage, **sampling)


@dataclass
class Answer:
    tokens: list[str]    # each generated token's text (streamed), or the whole text
    usage: dict          # the answer's `pyllamaopt` counters
    prefilled_at: float  # (monotonic) the first token's arrival, or the answer's: the prefill had ended


def answer(client: openai.OpenAI, ask: Ask, on_token: Callable[[int], None] = lambda n: None) -> Answer:
    """`ask` answered; ``on_token(n)`` after the n-th streamed token arrives."""
    if not ask.stream:
        out = ask.send(client)
        return Answer([out.choices[0].text], out.model_extra["pyllamaopt"], time.monotonic())
    tokens: list[str] = []
    usage, first = {}, None
    for chunk in ask.send(client):
        first = first or time.monotonic()
        if chunk.choices and chunk.choices[0].finish_reason is None:
            tokens.append(chunk.choices[0].text)
            on_token(len(tokens))
        usage = (chunk.model_extra or {}).get("pyllamaopt", usage)
    return Answer(tokens, usage, first)


class Reference:
    """Each request's answer from a server with persistence off, asked once."""

    def __init__(self, server: Server) -> None:
        self.client, self.answers = server.client(), {}

    def __call__(self, ask: Ask) -> Answer:
        if ask not in self.answers:
            self.answers[ask] = answer(self.client, ask)
        return self.answers[ask]


def difference(got: Answer, want: Answer) -> str:
    """'' if the answers are the same tokens, else what differs."""
    if got.tokens == want.tokens:
        return ""
    return f"answered {got.tokens[:8]}..., a server without the disk tier {want.tokens[:8]}..."


def entry_tokens(path: Path) -> list[int]:
    """The token ids an entry holds (header: n_tokens at 40, tokens_offset at 80)."""
    with path.open("rb") as f:
        header = f.read(128)
        (n_tokens,), (offset,) = struct.unpack_from("<I", header, 40), struct.unpack_from("<Q", header, 80)
        f.seek(offset)
        return list(struct.unpack(f"<{n_tokens}i", f.read(4 * n_tokens)))


def wrong_entries(directory: Path, sent: set[tuple[int, ...]]) -> list[str]:
    """What is wrong in the directory: entries whose checksums fail, entries whose tokens start no
    prompt that was sent."""
    store = PersistStore(directory)
    problems = [f"{path.name}: {problem}" for path, problem in store.verify().items()]
    for entry in store.entries():
        tokens = tuple(entry_tokens(entry.path))
        if not any(prompt[:len(tokens)] == tokens for prompt in sent):
            problems.append(f"{entry.path.name}: {len(tokens)} tokens that start no prompt sent")
    return problems


def blocks_in_common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Tokens of the complete blocks two prompts share."""
    n = len(os.path.commonprefix([a, b]))
    return n // BLOCK * BLOCK


class Life:
    """One server process, from its start to its kill: what it was asked and when each prefill ended."""

    def __init__(self, server: Server, directory: Path, rng: random.Random, system: tuple[int, ...],
                 n_vocab: int) -> None:
        self.server, self.directory, self.rng, self.system, self.n_vocab = server, directory, rng, system, n_vocab
        self.asked: list[tuple[Ask, float | None]] = []  # (request, when its prefill had ended; None: unknown)
        self.answers: dict[Ask, Answer] = {}
        self.point = ""  # where it was killed (KILL_POINTS)
        self.killed_at = 0.0
        self.writer_seen_busy = False

    def new_ask(self, unique_blocks: tuple[int, int], *, stream: bool | None = None, max_tokens: int = 0) -> Ask:
        """The system prompt and a tail of its own; a third of them sampled with a seed."""
        rng = self.rng
        n = rng.randint(unique_blocks[0] * BLOCK, unique_blocks[1] * BLOCK)
        tail = tuple(rng.randrange(3, self.n_vocab) for _ in range(n))
        stream = rng.random() < 0.5 if stream is None else stream
        return Ask(self.system + tail, max_tokens or rng.randint(2, 12), stream,
                   rng.randrange(2**31) if rng.random() < 0.3 else None)

    def ask(self, ask: Ask, on_token: Callable[[int], None] = lambda n: None) -> None:
        arrived: list[float] = []

        def token(n: int) -> None:
            arrived.append(time.monotonic())
            on_token(n)

        try:
            got = answer(self.server.client(), ask, token)
        except CUT_BY_THE_KILL:  # its prefill had ended if a token came
            self.asked.append((ask, arrived[0] if arrived else None))
            return
        self.answers[ask] = got
        self.asked.append((ask, got.prefilled_at))

    def kill(self) -> None:
        self.killed_at = time.monotonic()
        self.server.process.kill()
        self.server.process.wait(timeout=30)

    def kill_at(self, point: str) -> None:
        rng, self.point = self.rng, point
        if point == "mid-prefill":  # right after a long prompt is sent
            request = threading.Thread(target=self.ask, args=(self.new_ask((6, 12)),))
            request.start()
            time.sleep(rng.uniform(0.0, 0.05))
            self.kill()
            request.join()
        elif point == "mid-generation":  # in the middle of a stream
            cut = rng.randint(1, 40)

            def kill_at_the_cut(n: int) -> None:
                if n == cut:
                    self.kill()

            self.ask(self.new_ask((1, 3), stream=True, max_tokens=400), kill_at_the_cut)
            if not self.killed_at:  # the answer ended first (an end-of-sequence token)
                self.kill()
        else:  # as soon as the writer has a file open, while prompts that give it work are sent
            asks = [self.new_ask((1, 4)) for _ in range(rng.randint(2, 3))]
            requests = threading.Thread(target=lambda: [self.ask(a) for a in asks])
            requests.start()
            deadline = math.inf
            while not self.writer_seen_busy and time.monotonic() < deadline:
                self.writer_seen_busy = any(n.startswith(TMP_PREFIX) for n in os.listdir(self.directory))
                if deadline == math.inf and not requests.is_alive():
                    deadline = time.monotonic() + 1.0
            self.kill()
            requests.join()


def restart_problems(server: Server, killed: Life, reference: Reference) -> tuple[list[str], int]:
    """The killed server's requests sent again to its successor: the answers of a server with
    persistence off, and restored blocks for every prompt prefilled FLUSH_INTERVAL before the
    kill (beyond what this server has in RAM from the requests sent again before it). Returns
    what went wrong and how many prompts had to be restored."""
    problems, must_restore, seen = [], 0, []
    for ask, prefilled_at in killed.asked:
        got = answer(server.client(), ask)
        if wrong := difference(got, reference(ask)):
            problems.append(wrong)
        if prefilled_at is not None and killed.killed_at - prefilled_at >= FLUSH_INTERVAL:
            must_restore += 1
            # every complete block below the last chunk (always computed, for the logits)
            reusable = (len(ask.prompt) - BLOCK) // BLOCK * BLOCK
            in_ram = min(reusable, max((blocks_in_common(ask.prompt, p) for p in seen), default=0))
            reused = len(ask.prompt) - got.usage["computed_tokens"]
            if reused < reusable or got.usage["restored_tokens"] < reusable - in_ram:
                problems.append(f"prefilled {killed.killed_at - prefilled_at:.1f} s before the kill, "
                                f"{len(ask.prompt)} tokens: restored {got.usage['restored_tokens']} "
                                f"(>= {reusable - in_ram} expected), reused {reused} (>= {reusable})")
        seen.append(ask.prompt)
    return problems, must_restore


@pytest.fixture
def reference(tiny_model_path, tmp_path) -> Iterator[Reference]:
    server = start_server(tiny_model_path, tmp_path, *SERVER_ARGS)
    yield Reference(server)
    stop_server(server)


@contextlib.contextmanager
def killed_if_left_running(server: Server) -> Iterator[Server]:
    """`server`, killed if the block leaves it running (it failed midway)."""
    try:
        yield server
    finally:
        if server.process.poll() is None:
            server.process.kill()


def test_kill_9_at_random_points_loses_at_most_the_last_second_and_never_restores_wrong_kv(
        tiny_model_path, tiny_model, tmp_path, reference):
    rng = random.Random(SEED)
    directory = tmp_path / "kv"
    persist = {"LLAMA_OPT_PERSIST_ENABLED": "1", "LLAMA_OPT_PERSIST_DIR": str(directory)}
    system = tuple(rng.randrange(3, tiny_model.n_vocab) for _ in range(SYSTEM_TOKENS))
    sent: set[tuple[int, ...]] = set()
    problems: list[str] = []
    must_restore = 0
    points: collections.Counter[str] = collections.Counter()
    writer_seen_busy = 0  # mid-write kills that found the writer's temporary file
    killed: Life | None = None
    for kill in range(KILLS + 1):
        with killed_if_left_running(start_server(tiny_model_path, tmp_path, *SERVER_ARGS, env=persist)) as server:
            if killed is not None:
                found, n = restart_problems(server, killed, reference)
                problems += [f"after kill {kill} ({killed.point}): {p}" for p in found]
                must_restore += n
            if kill == KILLS:
                stop_server(server)
                break
            life = Life(server, directory, rng, system, tiny_model.n_vocab)
            for _ in range(rng.randint(1, 2)):  # prompts that settle: on disk FLUSH_INTERVAL later
                life.ask(life.new_ask((1, 4)))
            settled = time.monotonic() + FLUSH_INTERVAL + rng.uniform(0.05, 0.5)
            for ask in life.answers:  # (meanwhile)
                reference(ask)
            time.sleep(max(0.0, settled - time.monotonic()))
            life.kill_at(rng.choice(KILL_POINTS))
        points[life.point] += 1
        writer_seen_busy += life.writer_seen_busy
        sent |= {ask.prompt for ask, _ in life.asked}
        problems += [f"before kill {kill + 1}: {wrong}" for ask, got in life.answers.items()
                     if (wrong := difference(got, reference(ask)))]
        problems += [f"kill {kill + 1} ({life.point}): {p}" for p in wrong_entries(directory, sent)]
        killed = life
    verify = subprocess.run([sys.executable, "-m", "pyllamaopt.cli", "cache", "verify", "--dir", str(directory)],
                            capture_output=True, text=True, cwd=tmp_path)
    print(f"kills: {dict(points)} (the writer seen busy at {writer_seen_busy}, files of killed writes left: "
          f"{len(PersistStore(directory).leftovers())}); {must_restore} prompts to restore; {verify.stdout.strip()}")
    assert verify.returncode == 0 and ", 0 bad" in verify.stdout, verify.stdout + verify.stderr
    assert min(points[point] for point in KILL_POINTS) >= 3, points
    assert must_restore >= KILLS
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems)
