"""pyllamaopt/ray/affinity.py without Ray: a prompt's block chain is what the engine's pool names its
blocks by (the digest a replica reports, Context.pool_chains), the longest held prefix, and the
replica a session id names."""
from __future__ import annotations

from pyllamaopt.ray.affinity import Affinity, prompt_chains, session_id_prefix, session_replica


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
