// llama-opt configuration: defaults of the specification, environment parsing, sources,
// malformed values and typo detection.

#include "check.h"
#include "base/config.h"
#include "base/stats.h"
#include "base/types.h"

#include <map>
#include <string>

using env_t = std::map<std::string, std::string>;

static void test_defaults() {
    const llama_opt_config c = llama_opt_config_default();
    CHECK(c.block_size == 64);
    CHECK(c.dedup_pool_max == 16384);
    CHECK(c.diff_min_unchanged == 8);
    CHECK(c.precompute_rope_max == 131072);
    CHECK(c.memo_draft_max == 8);
    CHECK(c.attn_prune_window == 10);
    CHECK(c.attn_prune_threshold == 0.001f);
    CHECK(c.sparse_relevance_threshold == 0.1f);
    CHECK(!c.persist_enabled && c.persist_dir.empty());
    CHECK(!c.attn_prune_enabled && !c.sparse_attn_enabled && !c.act_dedup_enabled && !c.algebraic_enabled);
    CHECK(!c.h2o_enabled && !c.stats_enabled);
    CHECK(c.dedup_enabled == (LLAMA_OPT_DEDUP != 0));
    CHECK(!c.noop_enabled && !c.precompute_enabled);  // measured not to pay: no code, never on by default
    for (const auto & f : llama_opt_features()) {
        CHECK(f.implemented == (std::string(f.no_effect).empty()));
    }
    // every field has a variable, and every feature a field
    for (const auto & f : llama_opt_fields()) {
        CHECK(std::string(f.env).rfind("LLAMA_OPT_", 0) == 0);
    }
    for (const auto & f : llama_opt_features()) {
        CHECK(llama_opt_find_field(f.enabled_field) != nullptr);
    }
}

static void test_environment() {
    const auto s = llama_opt_settings::from_env({
        { "LLAMA_OPT_BLOCK_SIZE", "32" }, { "LLAMA_OPT_DIFF_ENABLED", "off" }, { "LLAMA_OPT_PERSIST_DIR", "/tmp/kv" },
        { "LLAMA_OPT_ATTN_PRUNE_THRESHOLD", "0.25" }, { "LLAMA_OPT_STATS", "TRUE" }, { "PATH", "/bin" } });
    CHECK(s.config.block_size == 32);
    CHECK(!s.config.diff_enabled);
    CHECK(s.config.persist_dir == "/tmp/kv");
    CHECK(s.config.attn_prune_threshold == 0.25f);
    CHECK(s.config.stats_enabled);
    CHECK(s.source_of("block_size") == llama_opt_source::environment);
    CHECK(s.source_of("dedup_pool_max") == llama_opt_source::default_value);
    CHECK(s.get("block_size") == "32");

    auto t = s;  // explicit arguments override the environment
    t.set("block_size", "128", llama_opt_source::argument);
    CHECK(t.config.block_size == 128);
    CHECK(t.source_of("block_size") == llama_opt_source::argument);
}

static void test_malformed() {
    for (const char * bad : { "abc", "0", "-1", "", "12x", "99999999999999999999", "1.5" }) {
        bool thrown = false;
        try {
            llama_opt_settings::from_env({ { "LLAMA_OPT_BLOCK_SIZE", bad } });
        } catch (const llama_opt_error & e) {
            thrown = e.code == llama_opt_errc::config && e.variable == "LLAMA_OPT_BLOCK_SIZE" &&
                     std::string(e.what()).find("LLAMA_OPT_BLOCK_SIZE") != std::string::npos;
        }
        CHECK(thrown);
    }
    for (const char * bad : { "-0.1", "1.5", "nan", "inf", "x", "" }) {
        CHECK_THROWS(llama_opt_settings::from_env({ { "LLAMA_OPT_ATTN_PRUNE_THRESHOLD", bad } }), llama_opt_errc::config);
    }
    CHECK_THROWS(llama_opt_settings::from_env({ { "LLAMA_OPT_DEDUP_ENABLED", "maybe" } }), llama_opt_errc::config);
    CHECK_THROWS(llama_opt_settings().set("no_such_option", "1", llama_opt_source::argument), llama_opt_errc::config);
}

static void test_unknown_variables() {
    bool suggested = false;
    try {
        llama_opt_settings::from_env({ { "LLAMA_OPT_BLOCK_SIZ", "32" } });
    } catch (const llama_opt_error & e) {
        suggested = e.variable == "LLAMA_OPT_BLOCK_SIZE" || std::string(e.what()).find("did you mean LLAMA_OPT_BLOCK_SIZE") != std::string::npos;
    }
    CHECK(suggested);
    CHECK_THROWS(llama_opt_settings::from_env({ { "LLAMA_OPT_SOMETHING_ELSE_ENTIRELY", "1" } }), llama_opt_errc::config);
    // names that belong to other parts of the program are allowed when listed
    const auto s = llama_opt_settings::from_env({ { "LLAMA_OPT_MODEL", "x.gguf" } }, { "LLAMA_OPT_MODEL" });
    CHECK(s.config.block_size == 64);
}

static void test_compiled_out_features() {
    for (const auto & f : llama_opt_features()) {
        if (f.compiled) {
            llama_opt_settings s;
            s.set(f.enabled_field, "1", llama_opt_source::argument);
            continue;
        }
        CHECK_THROWS(llama_opt_settings().set(f.enabled_field, "1", llama_opt_source::argument),
                     llama_opt_errc::feature_unavailable);
        llama_opt_settings s;  // turning a compiled-out feature off is fine
        s.set(f.enabled_field, "0", llama_opt_source::argument);
    }
}

static void test_stats() {
    llama_opt_stats a, b;
    a.dedup_blocks_hit = 5;
    a.forward_passes   = 2;
    b.dedup_blocks_hit = 3;
    const llama_opt_stats d = a - b;
    CHECK(d.dedup_blocks_hit == 2 && d.forward_passes == 2);
    a += b;
    CHECK(a.dedup_blocks_hit == 8);
    CHECK(a.to_string().find("dedup: blocks_total=0 blocks_hit=8") != std::string::npos);
    a.reset();
    CHECK(a.dedup_blocks_hit == 0 && a.forward_passes == 0);
    CHECK(llama_opt_stats_fields().size() == sizeof(llama_opt_stats) / sizeof(uint64_t));  // none forgotten
}

int main() {
    test_defaults();
    test_environment();
    test_malformed();
    test_unknown_variables();
    test_compiled_out_features();
    test_stats();
    return check_result("test-opt-config");
}
