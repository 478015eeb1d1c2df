// methods/grammar-trigger fires where llama.cpp's lazy grammar sampler fires
// (llama_grammar_accept_impl while awaiting a trigger) and hands the grammar the same text: the
// tokens overlapping the match, the first in part; a trigger token whole; patterns in their order.

#include "check.h"
#include "methods/grammar-trigger.h"

#include <string>
#include <utility>
#include <vector>

using pieces = std::vector<std::pair<llama_token, std::string>>;

// feeds the tokens until a trigger fires; returns the index of the firing token (-1: none) and what the grammar takes
static int run(const std::vector<llama_opt_grammar_trigger> & triggers, const pieces & output, pieces & start) {
    llama_opt_grammar_trigger_watch watch(triggers);
    std::vector<llama_opt_token_text> taken;
    for (size_t i = 0; i < output.size(); ++i) {
        if (watch.fires(output[i].first, output[i].second, taken)) {
            start.clear();
            for (const auto & t : taken) {
                start.emplace_back(t.token, t.text);
            }
            return (int) i;
        }
    }
    return -1;
}

static const pieces OUTPUT = { { 1, "Let me" }, { 2, " check" }, { 3, ". <to" }, { 4, "ol_c" }, { 5, "all>\n{" }, { 6, "\"" } };

static void test_a_word_split_over_tokens() {
    pieces start;
    CHECK(run({ { llama_opt_trigger_kind::word, "<tool_call>" } }, OUTPUT, start) == 4);
    CHECK((start == pieces{ { 3, "<to" }, { 4, "ol_c" }, { 5, "all>\n{" } }));
}

static void test_a_pattern_starts_at_its_first_group() {
    pieces start;
    CHECK(run({ { llama_opt_trigger_kind::pattern, "check\\. (<tool)" } }, OUTPUT, start) == 3);
    CHECK((start == pieces{ { 3, "<to" }, { 4, "ol_c" } }));
    // no group that matched something: from the match
    CHECK(run({ { llama_opt_trigger_kind::pattern, "ch(x?)eck" } }, OUTPUT, start) == 1);
    CHECK((start == pieces{ { 2, "check" } }));
}

static void test_a_full_pattern_matches_the_whole_output() {
    pieces start;
    // anchored as common/sampling.cpp anchors it: "Let" alone does not end the output
    CHECK(run({ { llama_opt_trigger_kind::pattern_full, "Let" } }, OUTPUT, start) == -1);
    CHECK(run({ { llama_opt_trigger_kind::pattern_full, "[\\s\\S]*?(<tool_call>)[\\s\\S]*" } }, OUTPUT, start) == 4);
    CHECK((start == pieces{ { 3, "<to" }, { 4, "ol_c" }, { 5, "all>\n{" } }));
}

static void test_a_token_is_taken_whole_and_triggers_go_in_order() {
    pieces start;
    CHECK(run({ { llama_opt_trigger_kind::token, "", 4 }, { llama_opt_trigger_kind::word, "check" } }, OUTPUT, start) == 1);
    CHECK((start == pieces{ { 2, "check" } }));
    CHECK(run({ { llama_opt_trigger_kind::token, "", 4 } }, OUTPUT, start) == 3);
    CHECK((start == pieces{ { 4, "ol_c" } }));
    // two patterns match the same text: the first given fires
    CHECK(run({ { llama_opt_trigger_kind::word, "call>" }, { llama_opt_trigger_kind::word, "_call" } }, OUTPUT, start) == 4);
    CHECK((start == pieces{ { 4, "c" }, { 5, "all>\n{" } }));
    CHECK(run({ { llama_opt_trigger_kind::word, "_call" }, { llama_opt_trigger_kind::word, "call>" } }, OUTPUT, start) == 4);
    CHECK((start == pieces{ { 4, "_c" }, { 5, "all>\n{" } }));
}

static void test_bad_triggers_are_refused() {
    CHECK_THROWS(llama_opt_grammar_trigger_watch({}), llama_opt_errc::grammar);
    CHECK_THROWS(llama_opt_grammar_trigger_watch({ { llama_opt_trigger_kind::pattern, "(unclosed" } }),
                 llama_opt_errc::grammar);
    CHECK_THROWS(llama_opt_grammar_trigger_watch({ { llama_opt_trigger_kind::word, "" } }), llama_opt_errc::grammar);
    CHECK_THROWS(llama_opt_trigger_kind_from_name("regex"), llama_opt_errc::invalid_argument);
    CHECK(llama_opt_trigger_kind_from_name("pattern_full") == llama_opt_trigger_kind::pattern_full);
}

int main() {
    test_a_word_split_over_tokens();
    test_a_pattern_starts_at_its_first_group();
    test_a_full_pattern_matches_the_whole_output();
    test_a_token_is_taken_whole_and_triggers_go_in_order();
    test_bad_triggers_are_refused();
    return check_result("test-opt-grammar-trigger");
}
