"""Stats: counters of the optimization layer and of the engine's work.

A ``Stats`` is a snapshot: ``context.stats`` and ``session.stats`` return a new one each time.
Attribute access per counter, ``as_dict()``, ``str()`` for humans, and ``later - earlier`` for
the counters of an interval.
"""
from __future__ import annotations

from ._core import Stats

__all__ = ["Stats"]
