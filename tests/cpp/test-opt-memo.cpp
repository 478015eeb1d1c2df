// memo: the draft is what followed the latest, longest earlier match of the history's end,
// as long as the match (at least LLAMA_OPT_MEMO_MATCH_MIN), capped by max_tokens.

#include "check.h"
#include "llama-memo.h"

#include <vector>

using tokens_t = std::vector<llama_token>;

static llama_opt_memo_draft find(const tokens_t & h, uint32_t max_tokens) {
    return llama_opt_memo_find(h.data(), h.size(), max_tokens);
}

static void test_no_draft_without_a_repetition() {
    CHECK(find({}, 8).tokens.empty());
    CHECK(find({ 1 }, 8).tokens.empty());
    CHECK(find({ 1, 2, 3, 4 }, 8).tokens.empty());
    CHECK(find({ 1, 2, 3, 1, 2 }, 0).tokens.empty());  // nothing asked
    // a one-token match is too weak to pay for its rows
    const llama_opt_memo_draft one = find({ 5, 1, 9, 9, 9, 7, 1 }, 8);
    CHECK(one.match == 1 && one.tokens.empty());
}

static void test_draft_follows_the_match() {
    // ... 1 2 3 [4 5 6 7] ... 1 2 3 -> match 3, draft 3 tokens
    const llama_opt_memo_draft d = find({ 9, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3 }, 8);
    CHECK(d.match == 3);
    CHECK((d.tokens == tokens_t{ 4, 5, 6 }));
    // capped by max_tokens
    CHECK((find({ 9, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3 }, 2).tokens == tokens_t{ 4, 5 }));
    // a draft never reads past the history's end
    const llama_opt_memo_draft end = find({ 1, 2, 1, 2 }, 8);
    CHECK(end.match == 2 && (end.tokens == tokens_t{ 1, 2 }));
}

static void test_longest_then_latest_match_wins() {
    // [2 3] at 1 is a 2-match, [1 2 3] at 5 a 3-match: the longer one
    CHECK((find({ 7, 2, 3, 40, 41, 1, 2, 3, 50, 51, 52, 0, 1, 2, 3 }, 8).tokens == tokens_t{ 50, 51, 52 }));
    // equal matches: the most recent
    CHECK((find({ 1, 2, 10, 11, 1, 2, 20, 21, 1, 2 }, 8).tokens == tokens_t{ 20, 21 }));
}

static void test_match_is_capped() {
    tokens_t h;
    for (int rep = 0; rep < 3; ++rep) {
        for (int i = 0; i < 20; ++i) {
            h.push_back(100 + i);
        }
    }
    h.resize(h.size() - 5);  // ends inside the third repetition
    const llama_opt_memo_draft d = find(h, 15);
    CHECK(d.match == LLAMA_OPT_MEMO_MATCH_MAX);
    CHECK(d.tokens.size() == LLAMA_OPT_MEMO_MATCH_MAX);
    CHECK(d.tokens.front() == 115);
}

static void test_a_check_confirms_drafted_tokens_in_order() {
    llama_opt_memo_check check;
    CHECK(!check.active() && check.confirm(4) == nullptr);
    const size_t n_vocab = 3;
    check.rows().assign({ 0, 0, 0, 1, 1, 1, 2, 2, 2 });  // rows after 0, 1 and 2 drafted tokens
    check.start({ 4, 5 }, n_vocab);
    CHECK(check.active() && check.row(0)[0] == 0);
    const float * after_4 = check.confirm(4);
    CHECK(after_4 != nullptr && after_4[0] == 1 && after_4[2] == 1);
    CHECK(check.confirm(6) == nullptr);  // not the next drafted token: the caller ends the check
    CHECK(check.active());               // ... until it does
    check.clear();
    CHECK(!check.active());
    check.start({ 4, 5 }, n_vocab);
    CHECK(check.confirm(4) != nullptr);
    const float * after_5 = check.confirm(5);
    CHECK(after_5 != nullptr && after_5[1] == 2);
    CHECK(!check.active());  // the whole draft confirmed
    check.release();
    CHECK(check.rows().empty() && !check.active());
}

int main() {
    test_a_check_confirms_drafted_tokens_in_order();
    test_no_draft_without_a_repetition();
    test_draft_follows_the_match();
    test_longest_then_latest_match_wins();
    test_match_is_capped();
    return check_result("test-opt-memo");
}
