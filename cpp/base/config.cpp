#include "base/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#if !defined(LLAMA_OPT_DEDUP) || !defined(LLAMA_OPT_H2O)
#error "compile with the LLAMA_OPT_* definitions of cmake/llama-opt-options.cmake"
#endif

extern char ** environ;

//
// features
//

// Why the features measured not to pay have no code path (docs/profiling.md: the numbers and
// the commands; Gemma 3 270M, canonical schedule). Their switches stay accepted (the
// specification's interface), off by default, and say so.
#define LLAMA_OPT_NO_EFFECT_PRECOMPUTE \
    "no effect: measured not to pay (RoPE's sin/cos 0.4 % of a prefill, which ggml computes once per position and " \
    "node; KQ mask construction at most 0.09 %; a norm's input repeats only at layer 0): docs/profiling.md"
#define LLAMA_OPT_NO_EFFECT_ACT_DEDUP \
    "no effect: measured not to pay (bit-identical rows exist only before the first attention, repeated tokens " \
    "at layer 0: under 1 % of a prefill): docs/profiling.md"
#define LLAMA_OPT_NO_EFFECT_NOOP \
    "no effect: measured not to pay (no zero row or output, no identity operand; one-hot softmax only at the " \
    "first position): docs/profiling.md"
#define LLAMA_OPT_NO_EFFECT_ALGEBRAIC \
    "no effect: nothing exact to rewrite (QKV already separate matmuls of one input; no two heads equal, even up to " \
    "a permutation; every matrix full rank): docs/profiling.md"

const std::vector<llama_opt_feature> & llama_opt_features() {
    // `implemented` turns true in the change that lands the feature's code path.
    static const std::vector<llama_opt_feature> features = {
        { "dedup",       "LLAMA_OPT_DEDUP",       "dedup_enabled",       1, LLAMA_OPT_DEDUP != 0,       true,  "" },
        { "kv_diff",     "LLAMA_OPT_KV_DIFF",     "diff_enabled",        1, LLAMA_OPT_KV_DIFF != 0,     true,  "" },
        { "schema_skip", "LLAMA_OPT_SCHEMA_SKIP", "schema_skip_enabled", 1, LLAMA_OPT_SCHEMA_SKIP != 0, true,  "" },
        { "kv_canon",    "LLAMA_OPT_KV_CANON",    "canon_enabled",       1, LLAMA_OPT_KV_CANON != 0,    true,  "" },
        { "precompute",  "LLAMA_OPT_PRECOMPUTE",  "precompute_enabled",  1, LLAMA_OPT_PRECOMPUTE != 0,  false,
          LLAMA_OPT_NO_EFFECT_PRECOMPUTE },
        { "kv_persist",  "LLAMA_OPT_KV_PERSIST",  "persist_enabled",     1, LLAMA_OPT_KV_PERSIST != 0,  true,  "" },
        { "memo",        "LLAMA_OPT_MEMO",        "memo_enabled",        1, LLAMA_OPT_MEMO != 0,        true,  "" },
        { "attn_prune",  "LLAMA_OPT_ATTN_PRUNE",  "attn_prune_enabled",  2, LLAMA_OPT_ATTN_PRUNE != 0,  true,  "" },
        { "sparse_attn", "LLAMA_OPT_SPARSE_ATTN", "sparse_attn_enabled", 2, LLAMA_OPT_SPARSE_ATTN != 0, true,  "" },
        { "spec_prefill", "LLAMA_OPT_SPEC_PREFILL", "spec_prefill_enabled", 2, LLAMA_OPT_SPEC_PREFILL != 0, true, "" },
        { "act_dedup",   "LLAMA_OPT_ACT_DEDUP",   "act_dedup_enabled",   1, LLAMA_OPT_ACT_DEDUP != 0,   false,
          LLAMA_OPT_NO_EFFECT_ACT_DEDUP },
        { "noop",        "LLAMA_OPT_NOOP",        "noop_enabled",        1, LLAMA_OPT_NOOP != 0,        false,
          LLAMA_OPT_NO_EFFECT_NOOP },
        { "algebraic",   "LLAMA_OPT_ALGEBRAIC",   "algebraic_enabled",   1, LLAMA_OPT_ALGEBRAIC != 0,   false,
          LLAMA_OPT_NO_EFFECT_ALGEBRAIC },
        { "h2o",         "LLAMA_OPT_H2O",         "h2o_enabled",         2, LLAMA_OPT_H2O != 0,         true,  "" },
    };
    return features;
}

static const llama_opt_feature * feature_for_field(const std::string & field) {
    for (const auto & f : llama_opt_features()) {
        if (field == f.enabled_field) {
            return &f;
        }
    }
    return nullptr;
}

//
// configuration
//

llama_opt_config llama_opt_config_default() {
    llama_opt_config c;
    c.dedup_enabled       = LLAMA_OPT_DEDUP != 0;
    c.diff_enabled        = LLAMA_OPT_KV_DIFF != 0;
    c.schema_skip_enabled = LLAMA_OPT_SCHEMA_SKIP != 0;
    c.canon_enabled       = LLAMA_OPT_KV_CANON != 0;
    c.persist_enabled     = false;  // runtime default off, as the specification says
    c.memo_enabled        = LLAMA_OPT_MEMO != 0;
    // Off although the specification says on: precomputation and no-op elision were measured not
    // to pay and have no code path (llama_opt_features' no_effect); a default of "on" would claim
    // work that is not done. Tier 2 and speculative Phase-5 features stay off even when compiled in.
    c.precompute_enabled  = false;
    c.noop_enabled        = false;
    return c;
}

#define OPT_BOOL(name, env, help) \
    { #name, env, llama_opt_value_kind::boolean, 0, 1, help, &llama_opt_config::name, nullptr, nullptr, nullptr }
#define OPT_UINT(name, env, lo, hi, help) \
    { #name, env, llama_opt_value_kind::uint, lo, hi, help, nullptr, &llama_opt_config::name, nullptr, nullptr }
#define OPT_REAL(name, env, lo, hi, help) \
    { #name, env, llama_opt_value_kind::real, lo, hi, help, nullptr, nullptr, &llama_opt_config::name, nullptr }
#define OPT_TEXT(name, env, help) \
    { #name, env, llama_opt_value_kind::text, 0, 0, help, nullptr, nullptr, nullptr, &llama_opt_config::name, nullptr }
#define OPT_CHOICE(name, env, choices, help) \
    { #name, env, llama_opt_value_kind::text, 0, 0, help, nullptr, nullptr, nullptr, &llama_opt_config::name, choices }

const std::vector<llama_opt_field> & llama_opt_fields() {
    static const std::vector<llama_opt_field> fields = {
        OPT_UINT(block_size,                 "LLAMA_OPT_BLOCK_SIZE",           1, 65536,      "tokens per hashed block"),
        OPT_BOOL(dedup_enabled,              "LLAMA_OPT_DEDUP_ENABLED",                        "context block deduplication"),
        OPT_UINT(dedup_pool_max,             "LLAMA_OPT_DEDUP_POOL_MAX",       1, 1u << 30,   "max blocks in the dedup pool"),
        OPT_BOOL(diff_enabled,               "LLAMA_OPT_DIFF_ENABLED",                         "structural KV cache diffing"),
        OPT_UINT(diff_min_unchanged,         "LLAMA_OPT_DIFF_MIN_UNCHANGED",   1, 1u << 30,   "min unchanged span worth keeping"),
        OPT_BOOL(diff_reuse_shifted,         "LLAMA_OPT_DIFF_REUSE_SHIFTED",                   "reuse unchanged spans after an edit, shifted (Tier 2)"),
        OPT_REAL(diff_recompute_share,       "LLAMA_OPT_DIFF_RECOMPUTE_SHARE", 0, 1,          "share of each shifted span computed again (Tier 2)"),
        OPT_REAL(diff_recompute_share_head,  "LLAMA_OPT_DIFF_RECOMPUTE_SHARE_HEAD", 0, 1,     "that share when the edit is in the prompt's first block (Tier 2)"),
        OPT_BOOL(diff_reuse_generated,       "LLAMA_OPT_DIFF_REUSE_GENERATED",                 "keep generated tokens' KV instead of computing it again (Tier 2)"),
        OPT_BOOL(schema_skip_enabled,        "LLAMA_OPT_SCHEMA_SKIP_ENABLED",                  "schema-aware token skipping"),
        OPT_BOOL(schema_skip_batch,          "LLAMA_OPT_SCHEMA_SKIP_BATCH",                    "forced tokens' KV in one batch however many (over 16 not bitwise)"),
        OPT_BOOL(schema_jump_forward,        "LLAMA_OPT_SCHEMA_JUMP_FORWARD",                  "take strings the grammar forces whole (changes tokenization)"),
        OPT_BOOL(schema_full_mask,           "LLAMA_OPT_SCHEMA_FULL_MASK",                     "check every token every step, as llama.cpp does (baseline)"),
        OPT_BOOL(schema_fit_max_tokens,      "LLAMA_OPT_SCHEMA_FIT_MAX_TOKENS",                "a grammar-constrained output ends within max_tokens: closed in time, not cut off"),
        OPT_BOOL(canon_enabled,              "LLAMA_OPT_CANON_ENABLED",                        "KV cache canonicalization"),
        OPT_BOOL(precompute_enabled,         "LLAMA_OPT_PRECOMPUTE_ENABLED",                   "deterministic precomputation (no effect: measured not to pay)"),
        OPT_UINT(precompute_rope_max,        "LLAMA_OPT_PRECOMPUTE_ROPE_MAX",  1, 1u << 30,   "max RoPE cache entries (no effect: no RoPE cache)"),
        OPT_BOOL(persist_enabled,            "LLAMA_OPT_PERSIST_ENABLED",                      "persistent KV cache on disk"),
        OPT_TEXT(persist_dir,                "LLAMA_OPT_PERSIST_DIR",                          "directory of the persistent KV cache"),
        OPT_UINT(persist_max_mb,             "LLAMA_OPT_PERSIST_MAX_MB",       0, 1u << 30,   "size budget of that directory in MiB (0: none)"),
        OPT_BOOL(persist_write_behind,       "LLAMA_OPT_PERSIST_WRITE_BEHIND",                 "write each prompt's new blocks behind, in a background thread, as soon as they are computed"),
        OPT_UINT(persist_flush_ms,           "LLAMA_OPT_PERSIST_FLUSH_MS",     0, 600000,     "a queued write waits this long for the same session's next one to merge into it (written behind within about this, plus the write)"),
        OPT_UINT(persist_queue_mb,           "LLAMA_OPT_PERSIST_QUEUE_MB",     1, 1u << 20,   "most MiB of rows queued for the background writer (more: the write is dropped, counted)"),
        OPT_BOOL(memo_enabled,               "LLAMA_OPT_MEMO_ENABLED",                         "token-level output memoization"),
        OPT_UINT(memo_draft_max,             "LLAMA_OPT_MEMO_DRAFT_MAX",       1, LLAMA_OPT_MEMO_MATCH_MAX,
                 "most tokens of earlier output checked in one forward pass"),
        OPT_BOOL(memo_shared,                "LLAMA_OPT_MEMO_SHARED",                          "memo drafts from every session's recent outputs, not only the session's own history"),
        OPT_BOOL(memo_gate,                  "LLAMA_OPT_MEMO_GATE",                            "check each memo draft only as far as its tokens are confirmed more often than their rows cost (timed as the context runs)"),
        OPT_UINT(row_kernels,                "LLAMA_OPT_ROW_KERNELS",          0, 2,          "small batches' matrix products: 0 row by row, 1 multi-row kernels, 2 the faster per weight type and row count (timed as the context runs); the same bits"),
        OPT_BOOL(attn_prune_enabled,         "LLAMA_OPT_ATTN_PRUNE_ENABLED",                   "attention sink pruning (Tier 2)"),
        OPT_UINT(attn_prune_window,          "LLAMA_OPT_ATTN_PRUNE_WINDOW",    1, 1u << 20,   "turns of inactivity before eviction"),
        OPT_REAL(attn_prune_threshold,       "LLAMA_OPT_ATTN_PRUNE_THRESHOLD", 0, 1,          "attention weight threshold"),
        OPT_REAL(attn_prune_budget,          "LLAMA_OPT_ATTN_PRUNE_BUDGET",    0, 1,          "share of the history's KV kept (0: the threshold alone decides)"),
        OPT_UINT(attn_prune_recent,          "LLAMA_OPT_ATTN_PRUNE_RECENT",    0, 1u << 24,   "most recent tokens never pruned"),
        OPT_UINT(attn_prune_queries,         "LLAMA_OPT_ATTN_PRUNE_QUERIES",   1, 4096,       "recent queries whose attention is scored per turn"),
        OPT_BOOL(sparse_attn_enabled,        "LLAMA_OPT_SPARSE_ATTN_ENABLED",                  "sparse attention over tool results (Tier 2)"),
        OPT_REAL(sparse_relevance_threshold, "LLAMA_OPT_SPARSE_ATTN_THRESHOLD", 0, 1,         "min relevance score of a span"),
        OPT_UINT(sparse_attn_keep_edges,     "LLAMA_OPT_SPARSE_ATTN_KEEP_EDGES", 0, 1u << 24, "first and last tokens of a tool result always kept"),
        OPT_UINT(sparse_attn_span,           "LLAMA_OPT_SPARSE_ATTN_SPAN",     1, 1u << 16,   "tokens per scored span of a tool result"),
        OPT_REAL(sparse_attn_budget,         "LLAMA_OPT_SPARSE_ATTN_BUDGET",   0, 1,          "share of a tool result kept (0: the threshold alone decides)"),
        OPT_BOOL(spec_prefill_enabled,       "LLAMA_OPT_SPEC_PREFILL_ENABLED",                 "speculative prefill: compute only the prompt tokens a scorer keeps (Tier 2)"),
        OPT_REAL(spec_prefill_keep,          "LLAMA_OPT_SPEC_PREFILL_KEEP",    0, 1,          "share of a prompt's tokens computed (the last always; 1: all, as exact)"),
        OPT_UINT(spec_prefill_layers,        "LLAMA_OPT_SPEC_PREFILL_LAYERS",  1, 4096,       "scorer: the model's first N layers (without a draft model)"),
        OPT_UINT(spec_prefill_last_layers,   "LLAMA_OPT_SPEC_PREFILL_LAST_LAYERS", 0, 4096,   "scores averaged over the scorer's last N layers (0: all; 001's last4 = 4, last1 = 1)"),
        OPT_UINT(spec_prefill_pool,          "LLAMA_OPT_SPEC_PREFILL_POOL",    1, 1024,       "average pooling kernel over neighbouring tokens' scores (1: none)"),
        OPT_UINT(spec_prefill_window,        "LLAMA_OPT_SPEC_PREFILL_WINDOW",  1, 1024,       "the prompt's last N tokens: their queries score it, averaged (001: 1), and they are always kept"),
        OPT_UINT(spec_prefill_min_tokens,    "LLAMA_OPT_SPEC_PREFILL_MIN_TOKENS", 2, 1u << 30, "prompts shorter than this are computed whole"),
        OPT_TEXT(spec_prefill_draft_model,   "LLAMA_OPT_SPEC_PREFILL_DRAFT_MODEL",             "scorer: a GGUF model with the same vocabulary (\"\": the model's first layers)"),
        OPT_BOOL(act_dedup_enabled,          "LLAMA_OPT_ACT_DEDUP_ENABLED",                    "activation deduplication (no effect: measured not to pay)"),
        OPT_BOOL(noop_enabled,               "LLAMA_OPT_NOOP_ENABLED",                         "no-op detection and elision (no effect: measured not to pay)"),
        OPT_BOOL(algebraic_enabled,          "LLAMA_OPT_ALGEBRAIC_ENABLED",                    "exact algebraic rewriting (no effect: nothing exact to rewrite)"),
        OPT_BOOL(h2o_enabled,                "LLAMA_OPT_H2O_ENABLED",                          "H2O heavy-hitter attention (Tier 2)"),
        OPT_UINT(h2o_local_window,           "LLAMA_OPT_H2O_LOCAL_WINDOW",     1, 1u << 24,   "H2O recent-token window"),
        OPT_UINT(h2o_heavy_budget,           "LLAMA_OPT_H2O_HEAVY_BUDGET",     0, 1u << 24,   "H2O heavy-hitter budget"),
        OPT_UINT(h2o_chunk_size,             "LLAMA_OPT_H2O_CHUNK_SIZE",       1, 1u << 24,   "H2O prompt tokens per chunk (>= window + budget)"),
        OPT_CHOICE(kv_type,                  "LLAMA_OPT_KV_TYPE",              LLAMA_OPT_KV_TYPES,
                   "how the KV cache stores K and V: f16, or llama.cpp's quantized q8_0 (half the bytes) or q4_0 (about a "
                   "quarter) for K and V (kv_type_k / kv_type_v: one alone); reuse is exact relative to the same types (needs "
                   "flash attention)"),
        OPT_CHOICE(kv_type_k,                "LLAMA_OPT_KV_TYPE_K",            LLAMA_OPT_KV_TYPES_OR_EMPTY,
                   "K's type alone (empty: kv_type's), as llama-server's --cache-type-k"),
        OPT_CHOICE(kv_type_v,                "LLAMA_OPT_KV_TYPE_V",            LLAMA_OPT_KV_TYPES_OR_EMPTY,
                   "V's type alone (empty: kv_type's), as llama-server's --cache-type-v"),
        OPT_BOOL(stats_enabled,              "LLAMA_OPT_STATS",                                "print per-turn statistics to stderr"),
    };
    return fields;
}

#undef OPT_BOOL
#undef OPT_UINT
#undef OPT_REAL
#undef OPT_TEXT
#undef OPT_CHOICE

const llama_opt_field * llama_opt_find_field(const std::string & name) {
    for (const auto & f : llama_opt_fields()) {
        if (name == f.name) {
            return &f;
        }
    }
    return nullptr;
}

const char * llama_opt_source_name(llama_opt_source source) {
    switch (source) {
        case llama_opt_source::default_value: return "default";
        case llama_opt_source::environment:   return "environment";
        case llama_opt_source::argument:      return "argument";
    }
    return "?";
}

static std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return (char) std::tolower(c); });
    return s;
}

static std::string trim(const std::string & s) {
    const auto b = s.find_first_not_of(" \t\r\n");
    const auto e = s.find_last_not_of(" \t\r\n");
    return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

static std::string format_real(double v) {
    char buf[64];
    snprintf(buf, sizeof(buf), "%.9g", v);
    return buf;
}

// "LLAMA_OPT_BLOCK_SIZE=abc" for environment values, "block_size='abc'" for arguments.
static std::string describe(const llama_opt_field & f, const std::string & text, llama_opt_source src) {
    if (src == llama_opt_source::environment) {
        return std::string(f.env) + "=" + text;
    }
    return std::string(f.name) + "='" + text + "'";
}

static bool parse_bool(const std::string & text, bool & out) {
    const std::string t = lower(trim(text));
    if (t == "1" || t == "true" || t == "yes" || t == "on") {
        out = true;
        return true;
    }
    if (t == "0" || t == "false" || t == "no" || t == "off") {
        out = false;
        return true;
    }
    return false;
}

// `text` if it is one of `choices` ("a|b|c", matched without regard to case); else fail() says which are
// (an empty choice, "|a|b", is the field's "not set": accepted, not listed).
template <typename Fail>
static std::string parse_choice(const std::string & text, const std::string & choices, Fail && fail) {
    const std::string t = lower(text);
    std::string allowed;
    for (size_t b = 0, e; b <= choices.size(); b = e + 1) {
        e = std::min(choices.find('|', b), choices.size());
        const std::string choice = choices.substr(b, e - b);
        if (t == choice) {
            return choice;
        }
        if (!choice.empty()) {
            allowed += (allowed.empty() ? "" : ", ") + choice;
        }
    }
    fail("must be one of " + allowed);
    return "";
}

void llama_opt_settings::set(const std::string & name, const std::string & text, llama_opt_source src) {
    const llama_opt_field * f = llama_opt_find_field(name);
    if (!f) {
        throw llama_opt_error(llama_opt_errc::config, "unknown configuration option '" + name + "'", name);
    }
    const std::string who = src == llama_opt_source::environment ? f->env : f->name;
    const std::string t   = trim(text);
    auto fail = [&](const std::string & why) {
        throw llama_opt_error(llama_opt_errc::config, describe(*f, text, src) + ": " + why, who);
    };
    auto check_range = [&](double v) {
        if (!(v >= f->min && v <= f->max)) {  // also rejects NaN
            fail("must be between " + format_real(f->min) + " and " + format_real(f->max));
        }
    };

    switch (f->kind) {
        case llama_opt_value_kind::boolean: {
            bool v = false;
            if (!parse_bool(t, v)) {
                fail("expected 1/0, true/false, yes/no or on/off");
            }
            const llama_opt_feature * feature = feature_for_field(f->name);
            if (v && feature && !feature->compiled) {
                throw llama_opt_error(llama_opt_errc::feature_unavailable,
                    describe(*f, text, src) + ": this build compiled the feature out (" +
                    feature->cmake_switch + "=OFF)" + (feature->implemented ? "; reinstall with CMAKE_ARGS=\"-D" +
                    std::string(feature->cmake_switch) + "=ON\" to use it" : std::string(", and it would have ") +
                    feature->no_effect), who);
            }
            config.*(f->as_bool) = v;
            break;
        }
        case llama_opt_value_kind::uint: {
            if (t.size() > 1 && t[0] == '-' && t.find_first_not_of("0123456789", 1) == std::string::npos) {
                check_range(-1.0);  // whole, but below every field's range: say which range
            }
            if (t.empty() || t.find_first_not_of("0123456789") != std::string::npos) {
                fail("expected a whole number");
            }
            errno = 0;
            const unsigned long long v = std::strtoull(t.c_str(), nullptr, 10);
            if (errno == ERANGE) {
                fail("number too large");
            }
            check_range((double) v);
            config.*(f->as_uint) = (uint32_t) v;
            break;
        }
        case llama_opt_value_kind::real: {
            char * end = nullptr;
            errno = 0;
            const double v = t.empty() ? NAN : std::strtod(t.c_str(), &end);
            if (t.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v)) {
                fail("expected a number");
            }
            check_range(v);
            config.*(f->as_real) = (float) v;
            break;
        }
        case llama_opt_value_kind::text:
            if (f->choices) {
                config.*(f->as_text) = parse_choice(t, f->choices, fail);
                break;
            }
            config.*(f->as_text) = text;
            break;
    }
    source[f->name] = src;
}

std::string llama_opt_settings::get(const std::string & name) const {
    const llama_opt_field * f = llama_opt_find_field(name);
    if (!f) {
        throw llama_opt_error(llama_opt_errc::config, "unknown configuration option '" + name + "'", name);
    }
    switch (f->kind) {
        case llama_opt_value_kind::boolean: return config.*(f->as_bool) ? "1" : "0";
        case llama_opt_value_kind::uint:    return std::to_string(config.*(f->as_uint));
        case llama_opt_value_kind::real:    return format_real(config.*(f->as_real));
        case llama_opt_value_kind::text:    return config.*(f->as_text);
    }
    return "";
}

llama_opt_source llama_opt_settings::source_of(const std::string & name) const {
    const auto it = source.find(name);
    return it == source.end() ? llama_opt_source::default_value : it->second;
}

static size_t edit_distance(const std::string & a, const std::string & b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) {
        row[j] = j;
    }
    for (size_t i = 1; i <= a.size(); ++i) {
        size_t diag = row[0];
        row[0]      = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            const size_t up = row[j];
            row[j] = std::min({ row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1) });
            diag   = up;
        }
    }
    return row[b.size()];
}

std::vector<std::string> llama_opt_env_names() {
    std::vector<std::string> names;
    for (const auto & f : llama_opt_fields()) {
        names.push_back(f.env);
    }
    return names;
}

llama_opt_settings llama_opt_settings::from_env(const std::map<std::string, std::string> & env,
                                                const std::vector<std::string> & other_names) {
    static const std::string prefix = "LLAMA_OPT_";
    llama_opt_settings settings;
    std::vector<std::string> known = llama_opt_env_names();
    known.insert(known.end(), other_names.begin(), other_names.end());

    for (const auto & kv : env) {
        const std::string & name = kv.first;
        if (name.compare(0, prefix.size(), prefix) != 0) {
            continue;
        }
        const llama_opt_field * field = nullptr;
        for (const auto & f : llama_opt_fields()) {
            if (name == f.env) {
                field = &f;
            }
        }
        if (field) {
            settings.set(field->name, kv.second, llama_opt_source::environment);
            continue;
        }
        if (std::find(other_names.begin(), other_names.end(), name) != other_names.end()) {
            continue;
        }
        const auto closest = std::min_element(known.begin(), known.end(), [&](const std::string & a, const std::string & b) {
            return edit_distance(name, a) < edit_distance(name, b);
        });
        std::string message = "unknown variable " + name + " in the environment";
        // a misspelling, not another name: a few edits, fewer for a short name (FOO is not MODEL)
        const size_t suffix = name.size() > 10 ? name.size() - 10 : 0;  // after "LLAMA_OPT_"
        if (edit_distance(name, *closest) <= std::min<size_t>(4, std::max<size_t>(1, suffix / 3))) {
            message += "; did you mean " + *closest + "?";
        }
        message += " (`pyllamaopt config --list` shows every variable; unset it to continue)";
        throw llama_opt_error(llama_opt_errc::config, message, name);
    }
    return settings;
}

std::map<std::string, std::string> llama_opt_environ() {
    std::map<std::string, std::string> env;
    for (char ** e = environ; e && *e; ++e) {
        const std::string entry = *e;
        const auto eq = entry.find('=');
        if (eq != std::string::npos) {
            env[entry.substr(0, eq)] = entry.substr(eq + 1);
        }
    }
    return env;
}
