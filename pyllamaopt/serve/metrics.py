"""Prometheus metrics of the server: the specification's (003 §2.8) and ours."""
from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from ..stats import Stats
    from .events import Usage

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_TOKEN_BUCKETS = tuple(float(4**k) for k in range(1, 10))  # 4 .. 262144
SHIFT_FALLBACK_REASONS = ("unsupported", "shared", "room")  # Stats.diff_shift_fallbacks_<reason>


class Metrics:
    """One registry per server (tests run several in one process)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.session_active = Gauge("session_active", "Open protocol sessions", registry=r)
        self.session_total = Counter("session_total", "Protocol sessions by how they ended (or 'created')",
                                     ["outcome"], registry=r)
        self.session_evicted_total = Counter("session_evicted_total", "Sessions closed by the server", ["reason"],
                                             registry=r)
        self.session_kv_live_bytes = Gauge("session_kv_live_bytes", "KV bytes of the cells in use", registry=r)
        self.generate_prefill_tokens = Histogram("generate_prefill_tokens", "Tokens received per prefill (reused or "
                                                 "computed)", buckets=_TOKEN_BUCKETS, registry=r)
        self.session_history_tokens = Histogram("session_history_tokens", "History length at a generation's start",
                                                buckets=_TOKEN_BUCKETS, registry=r)
        self.cache_invariant_violations_total = Counter(
            "cache_invariant_violations_total", "Sessions found inconsistent (a bug: must read 0)", ["kind"], registry=r)
        for kind in ("inv1", "inv2"):
            self.cache_invariant_violations_total.labels(kind=kind)
        self.generate_prefill_duration_seconds = Histogram(
            "generate_prefill_duration_seconds", "Time to take a prompt (reused or computed)",
            buckets=_LATENCY_BUCKETS, registry=r)
        self.tokens_computed = Counter("pyllamaopt_prompt_tokens_computed", "Prompt tokens whose KV was computed",
                                       registry=r)
        self.tokens_reused = Counter("pyllamaopt_prompt_tokens_reused", "Prompt tokens whose KV was reused",
                                     registry=r)
        self.tokens_restored = Counter("pyllamaopt_prompt_tokens_restored", "Prompt tokens read from the disk tier",
                                       registry=r)
        self.tokens_generated = Counter("pyllamaopt_tokens_generated", "Generated tokens", registry=r)
        self.tokens_drafted = Counter("pyllamaopt_tokens_drafted", "Generated tokens confirmed from memo drafts",
                                      registry=r)
        self.tokens_forced = Counter("pyllamaopt_tokens_grammar_forced", "Generated tokens the grammar forced",
                                     registry=r)
        self.sparse_tokens_dropped = Counter(
            "pyllamaopt_sparse_tokens_dropped", "Tool result tokens whose KV left attention (Tier 2, "
            "--sparse-tool-results)", registry=r)
        self.shift_fallbacks = Counter(
            "pyllamaopt_shift_fallbacks", "Tier-2 post-edit reuse plans refused before computing (exact mode's work "
            "instead), by reason (docs/exactness.md)", ["reason"], registry=r)
        for reason in SHIFT_FALLBACK_REASONS:
            self.shift_fallbacks.labels(reason=reason)
        self.persist_saves = Counter("pyllamaopt_persist_saves", "Contexts saved to the disk tier "
                                     "(LLAMA_OPT_PERSIST_ENABLED=1)", registry=r)
        self.persist_errors = Counter("pyllamaopt_persist_errors", "Saves to the disk tier that failed (a full disk, a "
                                      "read-only directory): the requests went on without them", registry=r)
        self._persist_seen = (0, 0)  # the context's totals counted so far: saves, errors
        self.queue_depth = Gauge("pyllamaopt_queue_depth", "Calls and generations waiting for the scheduler",
                                 registry=r)
        self.time_to_first_token_seconds = Histogram(
            "pyllamaopt_time_to_first_token_seconds", "From a request (or a session's generate) to its first token",
            buckets=_LATENCY_BUCKETS, registry=r)
        self.inter_token_latency_seconds = Histogram(
            "pyllamaopt_inter_token_latency_seconds", "Between two tokens of a generation",
            buckets=_LATENCY_BUCKETS, registry=r)

    def count_usage(self, usage: Usage) -> None:
        self.tokens_computed.inc(usage.computed)
        self.tokens_reused.inc(usage.cached_tokens)
        self.tokens_restored.inc(usage.restored)
        self.tokens_generated.inc(usage.completion_tokens)
        self.tokens_drafted.inc(usage.drafted)
        self.tokens_forced.inc(usage.forced)
        self.sparse_tokens_dropped.inc(usage.sparse_dropped)

    def follow_persist(self, totals: Stats) -> None:
        """The disk tier's saves and failures, from the context's totals (`totals`): they happen as
        sessions close or are written behind, not within one request's usage."""
        saves, errors = self._persist_seen
        self.persist_saves.inc(totals.persist_saves - saves)
        self.persist_errors.inc(totals.persist_errors - errors)
        self._persist_seen = (totals.persist_saves, totals.persist_errors)

    def count_shift_fallbacks(self, spent: Stats) -> None:
        for reason in SHIFT_FALLBACK_REASONS:
            self.shift_fallbacks.labels(reason=reason).inc(getattr(spent, f"diff_shift_fallbacks_{reason}"))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
