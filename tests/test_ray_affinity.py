"""pyllamaopt/ray/affinity.py without Ray: a prompt's block chain is what the engine's pool names its
blocks by and what its disk tier restores (the digest a replica reports: Context.pool_chains and
Context.persist_chains), the longest held prefix, the replica the router chooses by both tiers, and
the replica a session id names."""
from __future__ import annotations

import os

from pyllamaopt import Context, OptConfig, PersistStore
from pyllamaopt.ray.affinity import DISK_BLOCK_WORTH, Affinity, Held, Reuse, prompt_chains, session_id_prefix, \
    session_replica


def test_a_prompts_chain_is_what_the_pool_holds_after_it(tiny_context):
    prompt = list(range(10, 10 + 3 * tiny_context.block_size + 20))  # 3 blocks and a partial one
    session = tiny_context.session()
    session.append(prompt)
    chains = prompt_chains(prompt, tiny_context.block_size)
    assert len(chains) == 3 and set(chains) == set(tiny_context.pool_chains)
    other = prompt_chains(prompt[:64] + [7] * 64, tiny_context.block_size)
    assert other[0] == chains[0] and other[1] != chains[1]  # a chained hash names the whole prefix


def test_the_longest_held_prefix_counts_blocks():
    affinity = Affinity(chains=(1, 2, 3, 4), block_size=64)
    assert affinity.matched_blocks({1, 2}) == 2
    assert affinity.matched_blocks({1, 2, 3, 4, 9}) == 4
    assert affinity.matched_blocks({9}) == 0
    assert Affinity().matched_blocks({1}) == 0


def test_a_session_id_names_its_replica():
    sid = session_id_prefix("abc123") + "tok_en-9"
    assert session_replica(f"/v1/sessions/{sid}") == "abc123"
    assert session_replica(f"/v1/sessions/{sid}/generate") == "abc123"
    assert session_replica("/v1/sessions/tok_en-9") == ""  # no replica issued it
    assert session_replica("/v1/sessions") is None and session_replica("/v1/chat/completions") is None


def test_the_disk_tiers_digest_is_what_a_context_restores(tiny_model, tiny_context, tmp_path):
    """Every block of the entries a context of this model and build restores, an extension's with its
    parent's; none of an extension whose parent is gone (nothing of it restores); none without
    persistence."""
    block = tiny_context.block_size
    prompt = [10 + (7 * i) % 200 for i in range(5 * block + 20)]
    config = OptConfig(env={}, persist_enabled=True, persist_dir=str(tmp_path / "kv"))
    with Context(tiny_model, n_ctx=1024, n_batch=64, n_seq_max=4, n_threads=2, config=config) as ctx:
        session = ctx.session()
        session.append(prompt[:3 * block + 5])  # 3 blocks, then 2 more: an entry and its extension
        assert ctx.flush_persist(timeout=60)
        assert ctx.persist_chains == set(prompt_chains(prompt[:3 * block], block))
        session.append(prompt[3 * block + 5:])
        assert ctx.flush_persist(timeout=60)
        chains = prompt_chains(prompt, block)
        assert len(chains) == 5 and ctx.persist_chains == set(chains)
        layout = ctx.persist_layout
    assert layout is not None
    store = PersistStore(tmp_path / "kv")
    entries = {e.n_tokens: e for e in store.entries()}
    assert sorted(entries) == [3 * block, 5 * block] and entries[5 * block].base_tokens == 3 * block
    assert entries[5 * block].chain == chains and store.restorable_chains(layout) == set(chains)
    os.unlink(entries[3 * block].path)  # the parent, by hand: the extension is an orphan
    assert store.restorable_chains(layout) == set()
    assert tiny_context.persist_chains == set()


def test_a_replica_that_restores_wins_over_one_that_computes_and_loses_to_one_that_holds():
    """The router's choice by both tiers: a pooled block is worth 1, a block on disk beyond the pool
    DISK_BLOCK_WORTH (a restore is cheaper than a compute, dearer than a pool hit), a block to
    compute 0."""
    affinity = Affinity(chains=(1, 2, 3, 4, 5, 6), block_size=64)
    nothing, on_disk, in_pool = Held(pool=set()), Held(pool=set(), disk={1, 2, 3, 4}), Held(pool={1, 2, 3, 4})
    assert affinity.choose([nothing, on_disk]) == (1, Reuse(0, 4))  # without the disk tier: a tie, no prefix
    assert affinity.choose([on_disk, in_pool]) == (1, Reuse(4, 0))
    assert 0 < DISK_BLOCK_WORTH < 1
    # a longer prefix on disk beats a shorter one in RAM; the disk counts beyond what the pool holds
    assert affinity.choose([Held(pool={1}), Held(pool=set(), disk={1, 2, 3})]) == (1, Reuse(0, 3))
    assert affinity.reuse({1, 2}, {1, 2, 3, 4, 5}) == Reuse(2, 3) and affinity.reuse({1, 2, 3}, {1}) == Reuse(3, 0)
    # a disk tier every replica shares: the pool decides, then the queue
    shared = {1, 2, 3, 4, 5, 6}
    assert affinity.choose([Held(pool={1}, disk=shared), Held(pool={1, 2}, disk=shared)])[0] == 1
    assert affinity.choose([Held(set(), shared, queue=3), Held(set(), shared, queue=1)]) == (1, Reuse(0, 6))
