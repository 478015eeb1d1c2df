// kv-cache-diff: spans reconstruct the new history, single edits are found exactly, the
// common cases are linear, short KEEP spans are folded.

#include "check.h"
#include "kv/history-diff.h"

#include <random>
#include <vector>

using tokens_t = std::vector<llama_token>;

// Applies the spans to prev; also checks that they cover both histories in order.
static bool reconstructs(const tokens_t & prev, const tokens_t & curr, const llama_opt_diff_result & d) {
    tokens_t out;
    uint32_t p = 0, c = 0;
    for (const auto & s : d) {
        if (s.prev_start != p || s.curr_start != c) {
            return false;
        }
        if (s.op == DIFF_KEEP) {
            if (s.prev_length != s.curr_length) {
                return false;
            }
            out.insert(out.end(), prev.begin() + p, prev.begin() + p + s.prev_length);
        } else {
            out.insert(out.end(), curr.begin() + c, curr.begin() + c + s.curr_length);
        }
        p += s.prev_length;
        c += s.curr_length;
    }
    return p == prev.size() && c == curr.size() && out == curr;
}

static tokens_t random_tokens(std::mt19937 & rng, size_t n, int vocab = 50000) {
    tokens_t t(n);
    for (auto & x : t) {
        x = (llama_token) (rng() % vocab);
    }
    return t;
}

static llama_opt_diff_result diff(const llama_opt_diff_engine & e, const tokens_t & a, const tokens_t & b) {
    return e.compute(a.data(), (uint32_t) a.size(), b.data(), (uint32_t) b.size());
}

static void test_append_fast_path() {
    std::mt19937 rng(1);
    const llama_opt_diff_engine e(64);
    const tokens_t prev = random_tokens(rng, 1000);
    tokens_t curr = prev;
    const tokens_t more = random_tokens(rng, 300);
    curr.insert(curr.end(), more.begin(), more.end());
    const auto d = diff(e, prev, curr);
    CHECK(d.size() == 2 && d[0].op == DIFF_KEEP && d[0].prev_length == 1000 && d[1].op == DIFF_INSERT && d[1].curr_length == 300);
    CHECK(llama_opt_diff_common_prefix(d) == 1000);
    CHECK(reconstructs(prev, curr, d));
    CHECK(diff(e, prev, prev).size() == 1);
    CHECK(diff(e, {}, {}).empty());
    CHECK(reconstructs({}, curr, diff(e, {}, curr)) && diff(e, {}, curr)[0].op == DIFF_INSERT);
    CHECK(reconstructs(prev, {}, diff(e, prev, {})) && diff(e, prev, {})[0].op == DIFF_DELETE);
}

static void test_single_edits_are_exact() {
    std::mt19937 rng(2);
    const llama_opt_diff_engine e(64);
    for (int trial = 0; trial < 300; ++trial) {
        const tokens_t prev = random_tokens(rng, 1 + rng() % 2000);
        tokens_t curr = prev;
        const uint32_t at  = rng() % (prev.size() + 1);
        const uint32_t del = std::min<uint32_t>(rng() % 50, (uint32_t) prev.size() - at);
        const tokens_t ins = random_tokens(rng, rng() % 50, 1000000);  // never equal to what it replaces
        curr.erase(curr.begin() + at, curr.begin() + at + del);
        curr.insert(curr.begin() + at, ins.begin(), ins.end());
        const auto d = diff(e, prev, curr);
        CHECK(reconstructs(prev, curr, d));
        CHECK(llama_opt_diff_kept(d) == prev.size() - del);
        CHECK(llama_opt_diff_common_prefix(d) >= at);
    }
}

static void test_moved_and_multiple_edits() {
    std::mt19937 rng(3);
    const llama_opt_diff_engine e(16);
    for (int trial = 0; trial < 200; ++trial) {
        const tokens_t prev = random_tokens(rng, 200 + rng() % 2000);
        tokens_t curr = prev;
        for (int edit = 0; edit < 5; ++edit) {
            const uint32_t at  = rng() % (curr.size() + 1);
            const uint32_t del = std::min<uint32_t>(rng() % 40, (uint32_t) curr.size() - at);
            const tokens_t ins = random_tokens(rng, rng() % 40);
            curr.erase(curr.begin() + at, curr.begin() + at + del);
            curr.insert(curr.begin() + at, ins.begin(), ins.end());
        }
        const auto d = diff(e, prev, curr);
        CHECK(reconstructs(prev, curr, d));
        // at most 5 edits of <= 40 tokens each, plus block-sized slack around each of them
        CHECK(llama_opt_diff_kept(d) + 5 * (40 + 2 * 16) >= prev.size());
    }
}

// An agent trace's shape: a workspace file F near the start, edited (F2), and the edited
// version already quoted further on (a tool result that read the file back). The block matched
// first after the edit is found in that later quote too; the match must stay on the longer run
// (the rest of F, B, F2, C), not jump to the quote and lose everything before it.
static void test_a_copy_further_on_does_not_pull_the_match_away() {
    std::mt19937 rng(5);
    const llama_opt_diff_engine e(64);
    for (int trial = 0; trial < 100; ++trial) {
        const tokens_t a = random_tokens(rng, 100 + rng() % 400), f = random_tokens(rng, 400 + rng() % 800);
        const tokens_t b = random_tokens(rng, 50 + rng() % 300), c = random_tokens(rng, 50 + rng() % 300);
        const tokens_t d = random_tokens(rng, 1 + rng() % 100, 1000000);  // a new message: no common suffix
        const uint32_t at = 1 + rng() % 100, removed = 1 + rng() % 10;
        tokens_t f2(f.begin(), f.begin() + at);
        const tokens_t inserted = random_tokens(rng, 1 + rng() % 30, 1000000);
        f2.insert(f2.end(), inserted.begin(), inserted.end());
        f2.insert(f2.end(), f.begin() + at + removed, f.end());
        auto join = [](std::initializer_list<const tokens_t *> parts) {
            tokens_t out;
            for (const tokens_t * t : parts) {
                out.insert(out.end(), t->begin(), t->end());
            }
            return out;
        };
        const tokens_t prev = join({ &a, &f, &b, &f2, &c }), curr = join({ &a, &f2, &b, &f2, &c, &d });
        const auto diff_ = diff(e, prev, curr);
        CHECK(reconstructs(prev, curr, diff_));
        CHECK(llama_opt_diff_kept(diff_) >= prev.size() - removed);  // all but the replaced tokens: optimal
    }
}

static void test_min_unchanged_folds_short_spans() {
    const tokens_t prev = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 };
    const tokens_t curr = { 1, 2, 3, 90, 5, 6, 7, 8, 91, 10, 11, 12, 13, 14, 15, 16 };
    const auto fine   = diff(llama_opt_diff_engine(2, 1), prev, curr);
    const auto coarse = diff(llama_opt_diff_engine(2, 5), prev, curr);
    CHECK(reconstructs(prev, curr, fine) && reconstructs(prev, curr, coarse));
    CHECK(llama_opt_diff_kept(fine) == 14);     // 1 2 3 | 5 6 7 8 | 10..16
    CHECK(fine.size() == 5);                    // KEEP REPLACE KEEP REPLACE KEEP
    CHECK(llama_opt_diff_kept(coarse) == 10);   // the 4-token span folds into one REPLACE
    CHECK(coarse.size() == 3 && coarse[1].op == DIFF_REPLACE && coarse[1].prev_length == 6);
    CHECK(llama_opt_diff_common_prefix(coarse) == 3);
}

static void test_common_cases_are_linear() {
    std::mt19937 rng(4);
    const llama_opt_diff_engine e(64);
    for (uint32_t n : { 10000u, 100000u, 1000000u }) {
        const tokens_t prev = random_tokens(rng, n);
        tokens_t append = prev, edit = prev;
        append.push_back(7);
        edit[n / 2] = 1000001;
        diff(e, prev, append);
        CHECK(e.last_work() <= 2ull * n);
        diff(e, prev, edit);
        CHECK(e.last_work() <= 2ull * n);
    }
}

static void test_history() {
    llama_opt_context_history h;
    CHECK(!h.has_prev());
    const tokens_t a = { 1, 2 }, b = { 1, 2, 3 };
    h.record(a.data(), 2);
    CHECK(!h.has_prev() && h.curr_n_tokens() == 2);
    h.record(b.data(), 3);
    CHECK(h.has_prev() && h.prev_n_tokens() == 2 && h.curr_n_tokens() == 3 && h.prev_tokens()[1] == 2);
    h.clear();
    CHECK(!h.has_prev() && h.prev_n_tokens() == 0);
}

int main() {
    test_append_fast_path();
    test_single_edits_are_exact();
    test_moved_and_multiple_edits();
    test_a_copy_further_on_does_not_pull_the_match_away();
    test_min_unchanged_folds_short_spans();
    test_common_cases_are_linear();
    test_history();
    return check_result("test-opt-kv-diff");
}
