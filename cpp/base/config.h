#pragma once

// base/config: the optimization layer's features and configuration: compile-time defaults,
// LLAMA_OPT_* variables, explicit arguments, and where each value came from.
// Plain C++17 with no dependency on llama.cpp, so it is unit-testable on its own.

#include "base/numerics.h"
#include "base/types.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

//
// features
//

struct llama_opt_feature {
    const char * name;           // "dedup"
    const char * cmake_switch;   // "LLAMA_OPT_DEDUP"
    const char * enabled_field;  // "dedup_enabled" (config field that turns it on at runtime)
    int          tier;           // 1 = exact, 2 = approximate
    bool         compiled;       // compiled into this build
    bool         implemented;    // has a working code path in this version
    const char * no_effect;      // not implemented: why turning it on does nothing ("" if implemented)
};

const std::vector<llama_opt_feature> & llama_opt_features();

//
// configuration
//

// The KV cache types kv_type takes (kv/kv-codec maps each to llama.cpp's type); kv_type_k and
// kv_type_v take them too, or "" (the default: kv_type's).
constexpr const char * LLAMA_OPT_KV_TYPES          = "f16|q8_0|q4_0";
constexpr const char * LLAMA_OPT_KV_TYPES_OR_EMPTY = "|f16|q8_0|q4_0";

struct llama_opt_config {
    uint32_t block_size = 64;  // tokens per hashed block

    bool     dedup_enabled  = false;  // compile-time defaults are set in llama_opt_config_default()
    uint32_t dedup_pool_max = 16384;

    bool     diff_enabled       = false;
    uint32_t diff_min_unchanged = 8;
    bool     diff_reuse_shifted        = false;  // Tier 2: reuse unchanged spans after an edit, shifted
    float    diff_recompute_share      = 0.1f;   // Tier 2: share of each such span computed again,
    float    diff_recompute_share_head = 0.25f;  // or this one after an edit in the first block (attention sinks)
    bool     diff_reuse_generated      = false;  // Tier 2: keep the KV of generated tokens (decoded one by one)

    bool schema_skip_enabled = false;
    bool schema_skip_batch   = false;  // forced tokens computed in one batch with the next step
    bool schema_jump_forward = false;  // forced strings tokenized and taken whole (changes tokenization)
    bool schema_full_mask    = false;  // check every token every step, as llama.cpp's grammar sampler does
    bool schema_fit_max_tokens = false;  // a constrained output ends within max_tokens (closed, not cut off)
    bool canon_enabled       = false;

    bool     precompute_enabled  = false;
    uint32_t precompute_rope_max = 131072;

    bool        persist_enabled = false;
    std::string persist_dir;                // "" = llama_opt_persist_default_dir()
    uint32_t    persist_max_mb  = 10240;    // size budget of the directory (0 = none)
    bool        persist_write_behind = true;  // computed blocks queued for a background writer (kv/disk-writer)
    uint32_t    persist_queue_mb     = 256;   // bound on the rows queued for it; a job over it is dropped
    uint32_t    persist_flush_ms     = 250;   // a queued job waits this long for the same prompt's next piece

    bool     memo_enabled   = false;
    uint32_t memo_draft_max = LLAMA_OPT_MEMO_MATCH_MAX;  // most drafted tokens checked per forward pass (methods/memo.h)
    bool     memo_shared    = true;  // drafts from the context's recent outputs too, not only the session's history
    bool     memo_gate      = true;  // check drafts only as far as they pay here (methods/memo-gate)

    // small batches (<= 16 rows, memo checks) take 0006's one-row kernels row by row (0), 0009's
    // multi-row kernels (1), or the faster of the two per weight type and row count (2, methods/row-kernels)
    uint32_t row_kernels    = 2;

    bool     attn_prune_enabled   = false;
    uint32_t attn_prune_window    = 10;      // turns below the threshold before a block is pruned
    float    attn_prune_threshold = 0.001f;  // a block's attention mass per turn (scores summed over its tokens)
    float    attn_prune_budget    = 0.0f;    // share of the history's KV kept; 0: the threshold alone decides
    uint32_t attn_prune_recent    = 256;     // the most recent tokens are never pruned
    uint32_t attn_prune_queries   = 16;      // the last tokens of a turn whose attention is scored

    bool     sparse_attn_enabled        = false;
    float    sparse_relevance_threshold = 0.1f;
    uint32_t sparse_attn_keep_edges     = 64;    // first and last tokens of every tool result always kept
    uint32_t sparse_attn_span           = 64;    // tokens per scored span
    float    sparse_attn_budget         = 0.0f;  // share of a tool result kept; 0: the threshold alone decides

    // speculative prefill (001): a scorer picks the prompt tokens the model computes
    bool        spec_prefill_enabled     = false;
    float       spec_prefill_keep        = 0.3f;  // share of a prompt's tokens computed (1: all, as exact)
    uint32_t    spec_prefill_layers      = 6;     // scorer: the model's own first layers
    // measured on Gemma 3 270M (docs/benchmarks.md): the 6th layer alone (its first full-attention
    // one) with pooling over 13 tokens finds a needle that all 6 layers unpooled miss, and the last
    // 32 tokens' queries (the question's, kept whole) find it more often than the last token's
    uint32_t    spec_prefill_last_layers = 1;     // scores averaged over the scorer's last N layers (0: all)
    uint32_t    spec_prefill_pool        = 13;    // average pooling kernel over neighbouring tokens (1: none)
    uint32_t    spec_prefill_window      = 32;    // the prompt's last N tokens score it (001: 1) and are always kept
    uint32_t    spec_prefill_min_tokens  = 1024;  // shorter prompts are computed whole
    std::string spec_prefill_draft_model;         // scorer: a separate model with the same vocabulary ("" = none)

    bool act_dedup_enabled = false;
    bool noop_enabled      = false;
    bool algebraic_enabled = false;

    bool     h2o_enabled      = false;
    uint32_t h2o_local_window = 256;  // recent tokens always attended
    uint32_t h2o_heavy_budget = 256;  // heavy-hitter tokens kept beyond the window
    uint32_t h2o_chunk_size   = 512;  // prompt tokens per H2O chunk (>= window + budget)

    // How the KV cache stores K and V (kv/kv-codec): "f16" (llama.cpp's default), or llama.cpp's
    // quantized cache types "q8_0" / "q4_0" for both. Reuse stays exact relative to the same types.
    std::string kv_type   = "f16";
    std::string kv_type_k;  // K's type alone ("": kv_type's), as llama-server's --cache-type-k
    std::string kv_type_v;  // V's type alone ("": kv_type's), as llama-server's --cache-type-v

    bool stats_enabled = false;  // print per-turn statistics to stderr
};

// The compile-time defaults: the specification's defaults, minus compiled-out features.
llama_opt_config llama_opt_config_default();

enum class llama_opt_value_kind { boolean, uint, real, text };

// One configurable value: its name, environment variable, type and limits.
struct llama_opt_field {
    const char *         name;     // "block_size"
    const char *         env;      // "LLAMA_OPT_BLOCK_SIZE"
    llama_opt_value_kind kind;
    double               min;      // inclusive limits for numbers
    double               max;
    const char *         help;

    bool        llama_opt_config::* as_bool;
    uint32_t    llama_opt_config::* as_uint;
    float       llama_opt_config::* as_real;
    std::string llama_opt_config::* as_text;
    const char *                    choices;  // a text field taking one of these ("a|b|c"); null: any text
};

const std::vector<llama_opt_field> & llama_opt_fields();
const llama_opt_field * llama_opt_find_field(const std::string & name);

enum class llama_opt_source { default_value, environment, argument };
const char * llama_opt_source_name(llama_opt_source source);

// The effective configuration and where each value came from:
// compile-time default -> LLAMA_OPT_* environment -> explicit arguments.
struct llama_opt_settings {
    llama_opt_config                          config = llama_opt_config_default();
    std::map<std::string, llama_opt_source>   source;  // by field name; absent = default

    // Applies every LLAMA_OPT_* variable of `env`. A variable that is neither a field's nor
    // listed in `other_names` is an error (with the closest known name as a suggestion).
    static llama_opt_settings from_env(const std::map<std::string, std::string> & env,
                                       const std::vector<std::string> & other_names = {});

    // Parses `text` for field `name` and records its source. Throws llama_opt_error.
    void set(const std::string & name, const std::string & text, llama_opt_source src);

    std::string get(const std::string & name) const;  // the value as text
    llama_opt_source source_of(const std::string & name) const;
};

// The process environment as a map (for from_env).
std::map<std::string, std::string> llama_opt_environ();

// Every known variable name (fields' variables), for help texts and typo suggestions.
std::vector<std::string> llama_opt_env_names();
