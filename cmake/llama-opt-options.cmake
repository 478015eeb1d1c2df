# Compile-time switches of the optimization layer (defaults of the specification: Tier 2 and
# the speculative Phase-5 ones OFF, except the Tier-2 methods that have a code path: compiled
# in, off at runtime, as persistence is; a pip-installed package should not need a rebuild to
# measure them). A switch that is OFF compiles the feature out: the API reports it as
# unavailable and asking for it at runtime is an error. PRECOMPUTE, ACT_DEDUP, NOOP and ALGEBRAIC
# gate no code: measured not to pay (docs/profiling.md); their runtime switches are off and say so.
option(LLAMA_OPT_DEDUP       "context block deduplication"           ON)
option(LLAMA_OPT_KV_DIFF     "structural KV cache diffing"           ON)
option(LLAMA_OPT_SCHEMA_SKIP "schema-aware token skipping"           ON)
option(LLAMA_OPT_KV_CANON    "KV cache canonicalization"             ON)
option(LLAMA_OPT_PRECOMPUTE  "deterministic precomputation (no code: measured not to pay, docs/profiling.md)" ON)
option(LLAMA_OPT_KV_PERSIST  "persistent cross-session KV cache"     ON)
option(LLAMA_OPT_MEMO        "token-level output memoization"        ON)
option(LLAMA_OPT_ATTN_PRUNE  "attention sink pruning (Tier 2)"       ON)
option(LLAMA_OPT_SPARSE_ATTN "sparse tool attention (Tier 2)"        ON)
option(LLAMA_OPT_SPEC_PREFILL "speculative prefill (Tier 2)"     ON)
option(LLAMA_OPT_ACT_DEDUP   "activation deduplication (no code: measured not to pay)" OFF)
option(LLAMA_OPT_NOOP        "no-op detection and elision (no code: measured not to pay)" ON)
option(LLAMA_OPT_ALGEBRAIC   "exact algebraic rewriting (no code: nothing exact to rewrite)" OFF)
option(LLAMA_OPT_H2O         "H2O heavy-hitter sparse attention (Tier 2)" ON)

set(LLAMA_OPT_FEATURE_SWITCHES
    LLAMA_OPT_DEDUP LLAMA_OPT_KV_DIFF LLAMA_OPT_SCHEMA_SKIP LLAMA_OPT_KV_CANON
    LLAMA_OPT_PRECOMPUTE LLAMA_OPT_KV_PERSIST LLAMA_OPT_MEMO LLAMA_OPT_ATTN_PRUNE
    LLAMA_OPT_SPARSE_ATTN LLAMA_OPT_SPEC_PREFILL LLAMA_OPT_ACT_DEDUP LLAMA_OPT_NOOP LLAMA_OPT_ALGEBRAIC LLAMA_OPT_H2O)

# -DLLAMA_OPT_<NAME>=0|1 for every switch, so that code can test them with #if.
set(LLAMA_OPT_FEATURE_DEFINITIONS "")
foreach(switch IN LISTS LLAMA_OPT_FEATURE_SWITCHES)
    if(${switch})
        list(APPEND LLAMA_OPT_FEATURE_DEFINITIONS ${switch}=1)
    else()
        list(APPEND LLAMA_OPT_FEATURE_DEFINITIONS ${switch}=0)
    endif()
endforeach()
