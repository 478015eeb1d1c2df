"""OpenAI's ``n``: several choices of one prompt. The prompt is computed once, on the request's
session; each further choice is a fork of it (``Session.fork``: the prompt's blocks shared, not
computed again, but for its last chunk, which the canonical schedule keeps at least a block long:
64 to 127 tokens, about what a request repeating the prompt computes). The choices are generated together on the scheduler thread, a step of each in
turn, their decode steps computed in shared batches (``Session.prefetch_steps``: bit for bit what
each computes alone), so a choice is exactly the answer of a request of its own with its seed.

Seeds: choice i samples with ``seed + i`` (vLLM's and llama-server's rule), so that a seeded request
gives n different choices, each reproducible alone; without a seed each choice draws its own random
one. Greedy (temperature 0) choices are n times the same answer, as OpenAI's are.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Generator, Iterator, Sequence
from typing import Any

from ..session import Session
from .events import DoneEvent, Usage
from .params import GenerateParams
from .scheduler import PENDING

# The most choices a request may ask for: each holds a sequence of the context while it runs, and the
# server keeps 16 for requests in flight (app._REQUEST_SEQUENCES); 8 leaves room for other requests.
MAX_CHOICES = 8

SEEDS = 2**32 - 1  # seeds are in [0, 2**32 - 1): the engine's range, which `seed + i` wraps around in


def choice_params(params: GenerateParams, index: int) -> GenerateParams:
    """What choice `index` samples with: the request's settings, its seed + index."""
    if params.seed is None or index == 0:
        return params
    return dataclasses.replace(params, seed=(params.seed + index) % SEEDS)


def interleaved(runs: Sequence[Iterator[Any]], sessions: Sequence[Session]) -> Iterator[Any]:
    """The events of the choices' generations (`runs`, each primed, on `sessions`), each marked with
    its choice's index: a step of each in turn, the pending decode steps of those still running
    computed first in shared batches. However it ends (done, failed, closed by a client gone), every
    run is closed, so that each ends its session's turn."""
    running = dict(enumerate(runs))
    try:
        while running:
            if len(running) > 1:
                # (a failure here reaches the choice it concerns from its own step, as in the scheduler)
                with contextlib.suppress(Exception):
                    Session.prefetch_steps([sessions[i] for i in running])
            for index, run in list(running.items()):
                event = next(run, None)
                if event is None:
                    del running[index]
                elif event is not PENDING:
                    yield dataclasses.replace(event, index=index)
    finally:
        for run in runs:
            if isinstance(run, Generator):  # (each is: GenerationRunner.events)
                run.close()


class ChoiceTally:
    """A request's choices as they end, and what they cost together."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.dones: dict[int, DoneEvent] = {}

    def add(self, done: DoneEvent) -> bool:
        """Counts a choice's end; True when it is the last."""
        self.dones[done.index] = done
        return len(self.dones) == self.n

    @property
    def usage(self) -> Usage:
        """The usage of all choices: the prompt once (the forks' generations count none of it: it
        was the first choice's), every choice's completion tokens, every token computed (each fork's
        last chunk of the prompt included)."""
        usages = [done.usage for done in self.dones.values()]
        summed: dict[str, Any] = {field.name: sum(getattr(u, field.name) for u in usages)
                  for field in dataclasses.fields(Usage) if field.name != "approximate"}
        return Usage(**summed, approximate=any(u.approximate for u in usages))

    def extension(self) -> dict[str, Any]:
        """The answer's ``pyllamaopt`` field: the usage's counters; with one choice, its schema and
        reply fields too (each of several choices carries its own)."""
        fields = self.dones[0].answer_fields() if self.n == 1 else {}
        return {**self.usage.as_dict(), **fields}
