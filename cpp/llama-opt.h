#pragma once

// llama-opt: configuration, statistics and errors of the optimization layer.
// Plain C++17 with no dependency on llama.cpp, so it is unit-testable on its own.

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

typedef int32_t llama_token;  // same typedef as llama.h (a redeclaration is legal C++)
typedef int32_t llama_pos;

//
// errors
//

// What went wrong, so that the Python layer can raise a specific exception type.
enum class llama_opt_errc {
    config,               // malformed LLAMA_OPT_* value or option
    feature_unavailable,  // asked for a feature that this build compiled out
    model_load,           // missing, unreadable or invalid model file
    invalid_token,        // token id outside the vocabulary
    context_overflow,     // history would not fit the context
    session_closed,       // use of a closed session
    session_evicted,      // use of a session whose KV was evicted to make room
    decode_failed,        // llama_decode failed for another reason
    invalid_argument,     // any other bad argument
    grammar,              // invalid grammar
};

struct llama_opt_error : std::runtime_error {
    llama_opt_errc code;
    std::string    variable;  // the LLAMA_OPT_* variable or option at fault, if any

    llama_opt_error(llama_opt_errc code, const std::string & message, std::string variable = "")
        : std::runtime_error(message), code(code), variable(std::move(variable)) {}
};

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

// Cells per tile of the KV that a decode step's flash attention reduces on its own (patches/0003).
// With flash attention a sequence's blocks start at multiples of it (llama-opt-context.cpp), so
// every tile holds one block's cells and a step's result does not depend on other sequences.
constexpr uint32_t LLAMA_OPT_FA_KV_TILE = 64;

// Batches of up to this many tokens compute each row exactly as a one-token decode step would
// (patches/0006): the memo checks a draft and the step before it in one such batch.
constexpr uint32_t LLAMA_OPT_ROW_INVARIANT_BATCH = 16;

// memo: the longest suffix of the history matched earlier, and so the longest draft
// (memo_draft_max's bound; llama-memo.h explains the policy)
constexpr uint32_t LLAMA_OPT_MEMO_MATCH_MAX = 8;
static_assert(LLAMA_OPT_MEMO_MATCH_MAX + 1 <= LLAMA_OPT_ROW_INVARIANT_BATCH,
              "a draft and the step before it must fit one row-invariant batch");

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

    bool     memo_enabled   = false;
    uint32_t memo_draft_max = LLAMA_OPT_MEMO_MATCH_MAX;  // most drafted tokens checked per forward pass (llama-memo.h)
    bool     memo_shared    = true;  // drafts from the context's recent outputs too, not only the session's history

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

//
// statistics
//

struct llama_opt_stats {
    // Phase 1 - context block dedup
    uint64_t dedup_blocks_total   = 0;
    uint64_t dedup_blocks_hit     = 0;
    uint64_t dedup_tokens_saved   = 0;
    uint64_t dedup_sequences_evicted = 0;  // cached (closed) sequences dropped to make room
    // Phase 1 - KV cache diffing
    uint64_t diff_tokens_total      = 0;
    uint64_t diff_tokens_unchanged  = 0;
    uint64_t diff_tokens_recomputed = 0;
    uint64_t diff_tokens_shifted    = 0;  // Tier 2: reused at a new position after an edit
    // Tier 2: post-edit reuse refused before computing anything (sync then does exact mode's work), by reason:
    uint64_t diff_shift_fallbacks_unsupported = 0;  // the KV memory cannot move rows (flash attention off)
    uint64_t diff_shift_fallbacks_shared      = 0;  // an open session (a fork) holds cells past the edit too
    uint64_t diff_shift_fallbacks_room        = 0;  // no room above the session's cells for its growth
    // Phase 1 - schema-aware skipping
    uint64_t schema_tokens_total    = 0;
    uint64_t schema_tokens_skipped  = 0;
    uint64_t schema_tokens_inferred = 0;
    uint64_t schema_check_us        = 0;  // time spent asking the grammar what it allows
    uint64_t schema_budget_picks    = 0;  // tokens picked (or sampling sets) changed to end within max_tokens
    // Phase 2 - KV canonicalization
    uint64_t canon_entries_total   = 0;
    uint64_t canon_entries_deduped = 0;
    uint64_t canon_bytes_saved     = 0;
    // Phase 2 - precomputation
    uint64_t precompute_rope_hits = 0;
    uint64_t precompute_norm_hits = 0;
    uint64_t precompute_mask_hits = 0;
    // Phase 2 - persistent KV
    uint64_t persist_loads           = 0;
    uint64_t persist_saves           = 0;
    uint64_t persist_tokens_restored = 0;
    uint64_t persist_misses              = 0;  // nothing stored for the prompt
    uint64_t persist_misses_incompatible = 0;  // stored, but for another model or build
    uint64_t persist_misses_corrupt      = 0;  // a stored entry failed its checksums (removed)
    uint64_t persist_errors              = 0;  // saves that failed (disk full, not writable)
    // Phase 3 - output memoization
    uint64_t memo_lookups               = 0;
    uint64_t memo_hits                  = 0;
    uint64_t memo_tokens_skipped        = 0;
    uint64_t memo_shared_hits           = 0;  // drafts checked that came from the context's recent outputs
    uint64_t memo_shared_tokens_skipped = 0;  // of memo_tokens_skipped, the tokens of those drafts
    // Phase 4 - attention pruning
    uint64_t attn_blocks_pruned     = 0;
    uint64_t attn_tokens_pruned     = 0;
    uint64_t attn_blocks_restored   = 0;  // cold blocks back in attention (relevant again)
    uint64_t attn_tokens_restored   = 0;
    uint64_t attn_tokens_recomputed = 0;  // a turn's tokens computed again to see restored blocks
    uint64_t attn_keys_scored       = 0;  // keys scored on the host (cost of scoring)
    uint64_t attn_score_us          = 0;  // time spent reading keys and scoring them
    // Phase 4 - sparse attention over tool results
    uint64_t sparse_spans_dropped  = 0;
    uint64_t sparse_tokens_dropped = 0;
    // Tier 2 - H2O chunked sparse prefill
    uint64_t h2o_chunks      = 0;  // prompt chunks computed with attention subsets
    uint64_t h2o_tokens_kept = 0;  // memory-set entries, summed over chunks, layers and heads
    uint64_t h2o_select_us   = 0;  // time in subsets, score updates and memory-set construction
    // Tier 2 - speculative prefill
    uint64_t spec_prefill_prompts        = 0;  // prompts scored
    uint64_t spec_prefill_tokens_scored  = 0;  // tokens the scorer computed (to its layers, or the draft's)
    uint64_t spec_prefill_tokens_kept    = 0;  // of the scored prompts, tokens the model computed
    uint64_t spec_prefill_tokens_dropped = 0;  // ... and tokens it left out (positions without KV)
    uint64_t spec_prefill_score_us       = 0;  // time spent scoring (scorer forward passes and host scoring)
    // Phase 5 - activation dedup
    uint64_t act_lookups = 0;
    uint64_t act_hits    = 0;
    // Phase 5 - no-op elision
    uint64_t noop_ops_elided = 0;

    // Work counters of the engine (what the optimizations save is measured against these)
    uint64_t tokens_prefilled = 0;  // tokens whose KV was computed by append (prompt batches)
    uint64_t tokens_decoded   = 0;  // tokens whose KV was computed by generation steps
    uint64_t tokens_generated = 0;  // tokens sampled
    uint64_t forward_passes   = 0;  // llama_decode calls (one ubatch each)
    uint64_t forward_us       = 0;  // time inside llama_decode (a batch of several sessions' rows: split evenly)
    uint64_t sessions_evicted = 0;  // idle sessions whose KV was dropped to make room

    void reset() { *this = llama_opt_stats(); }

    llama_opt_stats & operator+=(const llama_opt_stats & other);
    llama_opt_stats   operator-(const llama_opt_stats & other) const;

    std::string to_string() const;  // human-readable, one group per line
    void        print() const;      // to_string() to stderr
};

struct llama_opt_stats_field {
    const char *              name;
    uint64_t llama_opt_stats::* member;
};

const std::vector<llama_opt_stats_field> & llama_opt_stats_fields();
