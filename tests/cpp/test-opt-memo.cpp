// memo: the draft is what followed the latest, longest earlier match of the history's end,
// as long as the match (at least LLAMA_OPT_MEMO_MATCH_MIN), capped by max_tokens.

#include "check.h"
#include "methods/memo.h"
#include "methods/memo-gate.h"

#include <cmath>
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

// the context's recent outputs: drafts for a history that does not hold the repetition itself
static llama_opt_memo_draft find_shared(const llama_opt_memo_outputs & outputs, const tokens_t & h, uint32_t max_tokens) {
    llama_opt_memo_draft d = find(h, max_tokens);
    outputs.improve(h.data(), h.size(), max_tokens, d);
    return d;
}

static void add(llama_opt_memo_outputs & outputs, const tokens_t & lead_in, const tokens_t & output) {
    outputs.add(lead_in.data(), lead_in.size(), output.data(), output.size());
}

static void test_an_output_drafts_for_a_history_ending_like_its_prompt() {
    llama_opt_memo_outputs outputs;
    add(outputs, { 1, 2, 3, 7, 8 }, { 40, 41, 42, 43 });
    // another history ending in the same 2 tokens: the output's beginning, as long as the match
    const llama_opt_memo_draft start = find_shared(outputs, { 9, 9, 5, 7, 8 }, 8);
    CHECK(start.shared && start.match == 2 && (start.tokens == tokens_t{ 40, 41 }));
    // inside the output, and never past its end
    const llama_opt_memo_draft inside = find_shared(outputs, { 5, 7, 8, 40, 41, 42 }, 8);
    CHECK(inside.shared && (inside.tokens == tokens_t{ 43 }));
    CHECK(find_shared(outputs, { 5, 42, 43 }, 8).tokens.empty());  // at the output's last token: nothing follows
    CHECK(find_shared(outputs, { 7, 8 }, 0).tokens.empty());      // nothing asked
    // only the last LLAMA_OPT_MEMO_MATCH_MAX tokens of the lead-in are kept
    add(outputs, { 60, 1, 2, 3, 4, 5, 6, 7, 8 }, { 50 });
    CHECK(outputs.n_tokens() == 5 + 4 + LLAMA_OPT_MEMO_MATCH_MAX + 1);
    CHECK(find_shared(outputs, { 60, 1 }, 8).tokens.empty());
}

static void test_the_history_wins_unless_an_output_matches_longer() {
    llama_opt_memo_outputs outputs;
    add(outputs, { 1, 2, 3 }, { 70, 71, 72 });
    // the history's own 2-match against the output's 3-match: the output
    const llama_opt_memo_draft longer = find_shared(outputs, { 2, 3, 30, 31, 1, 2, 3 }, 8);
    CHECK(longer.shared && longer.match == 3 && (longer.tokens == tokens_t{ 70, 71, 72 }));
    // equally long: the history's own
    const llama_opt_memo_draft own = find_shared(outputs, { 1, 2, 3, 30, 31, 9, 1, 2, 3 }, 8);
    CHECK(!own.shared && own.match == 3 && (own.tokens == tokens_t{ 30, 31, 9 }));
    // of two outputs with equal matches, the newer
    add(outputs, { 1, 2, 3 }, { 80, 81, 82 });
    CHECK((find_shared(outputs, { 5, 1, 2, 3 }, 8).tokens == tokens_t{ 80, 81, 82 }));
}

static void test_outputs_are_bounded_oldest_first() {
    llama_opt_memo_outputs outputs;
    const tokens_t long_output(llama_opt_memo_outputs::capacity_tokens + 100, 7);
    add(outputs, { 1, 2 }, long_output);  // cut to the capacity, lead-in included
    CHECK(outputs.size() == 1 && outputs.n_tokens() == llama_opt_memo_outputs::capacity_tokens);
    add(outputs, { 3, 4 }, { 90, 91 });  // the first one goes
    CHECK(outputs.size() == 1 && outputs.n_tokens() == 4);
    CHECK((find_shared(outputs, { 3, 4 }, 8).tokens == tokens_t{ 90, 91 }));
    for (size_t i = 0; i < llama_opt_memo_outputs::capacity_outputs + 10; ++i) {
        add(outputs, { 5, 6 }, { (llama_token) (1000 + i) });
    }
    CHECK(outputs.size() == llama_opt_memo_outputs::capacity_outputs);
    CHECK(find_shared(outputs, { 3, 4 }, 8).tokens.empty());  // the oldest outputs went
    add(outputs, { 5, 6 }, {});                                 // an empty output is not kept
    CHECK(outputs.size() == llama_opt_memo_outputs::capacity_outputs);
    outputs.clear();
    CHECK(outputs.size() == 0 && outputs.n_tokens() == 0);
}

// Checks of `n` drafted tokens after a match of `match`, each row at `row` of a step, whose first
// `yes` tokens sampling confirms.
static void check(llama_opt_memo_gate & gate, uint32_t match, uint32_t n, double row, uint32_t yes, int times = 1) {
    for (int t = 0; t < times; ++t) {
        gate.checked(match, n, n * row * gate.step_us());
        for (uint32_t place = 1; place <= n && place <= yes + 1; ++place) {  // sampling stops at the first miss
            gate.compared(match, place, place <= yes);
        }
    }
}

// How many of `decisions` drafts of 8 tokens after a match of `match` the gate cut to each length.
static std::vector<uint32_t> lengths(llama_opt_memo_gate & gate, uint32_t match, uint32_t decisions) {
    std::vector<uint32_t> seen(LLAMA_OPT_MEMO_MATCH_MAX + 1, 0);
    for (uint32_t i = 0; i < decisions; ++i) {
        ++seen[gate.draft_length(match, 8)];
    }
    return seen;
}

// Before a step is timed the whole draft goes; then the priors (a row at half a step, a token
// compared confirmed 4 times in 5) check the places whose chance to be reached and confirmed
// (0.8, 0.64, 0.51, 0.41...) outweighs the row: 3 tokens. Never more than asked.
static void test_the_gate_starts_from_its_priors() {
    llama_opt_memo_gate gate;
    CHECK(gate.draft_length(3, 8) == 8 && gate.draft_length(3, 2) == 2);
    gate.step(1000);
    CHECK(gate.step_us() == 1000);
    CHECK(gate.row_steps() == llama_opt_memo_gate::prior_row);
    CHECK(gate.draft_length(3, 8) == 3 && gate.draft_length(3, 2) == 2);
}

// Rows cheap against the confirmations (Gemma copying a file): whole drafts. Rows at 0.6 of a step
// with the first two drafted tokens always confirmed and the third never: drafts cut to 2, and one
// decision in probe_every measures the third place.
static void test_the_gate_cuts_where_a_row_costs_more_than_it_saves() {
    llama_opt_memo_gate gate;
    gate.step(1000);
    check(gate, 6, 8, 0.2, 8, 50);
    CHECK(gate.draft_length(6, 8) == 8);
    llama_opt_memo_gate cut;
    cut.step(1000);
    check(cut, 5, 3, 0.6, 2, 50);
    CHECK(cut.chance(5, 1) > 0.95 && cut.chance(5, 3) < 0.1);
    const std::vector<uint32_t> seen = lengths(cut, 5, 4 * llama_opt_memo_gate::probe_every);
    CHECK(seen[2] == 4 * (llama_opt_memo_gate::probe_every - 1) && seen[3] == 4);
}

// Rows at a step each (SmolLM2 at chat depths) with 58 % of first tokens confirmed: nothing pays,
// and only the probes, one token each, are checked.
static void test_the_gate_closes_where_no_row_pays() {
    llama_opt_memo_gate gate;
    gate.step(1000);
    for (int i = 0; i < 50; ++i) {
        check(gate, 4, 1, 1.0, i % 50 < 29 ? 1 : 0);
    }
    const std::vector<uint32_t> seen = lengths(gate, 4, 4 * llama_opt_memo_gate::probe_every);
    CHECK(seen[0] == 4 * (llama_opt_memo_gate::probe_every - 1) && seen[1] == 4);
}

// A length not seen yet follows what all lengths have shown; one with counts of its own follows
// its own.
static void test_a_new_length_starts_from_all_lengths() {
    llama_opt_memo_gate gate;
    gate.step(1000);
    check(gate, 3, 2, 0.7, 0, 40);  // after matches of 3 the first drafted token is never confirmed
    CHECK(gate.draft_length(7, 8) == 0);
    check(gate, 8, 4, 0.7, 4, 40);  // after matches of 8 (and longer) every one is
    // 4 places measured, the 5th at all lengths' prior (0.8): 0.8 of ~0.96 still above 0.7
    CHECK(gate.draft_length(8, 8) == 5 && gate.draft_length(12, 8) == 5);
    CHECK(gate.draft_length(3, 8) == 0);
}

// The figures as docs/memo.md states them: all lengths' rate of a place with the prior (0.8) as 2
// comparisons, a length's own counts with all lengths' rate as `shrink` comparisons, each check
// fading both by `decay`.
static void test_the_chance_is_shrunk_as_documented() {
    llama_opt_memo_gate gate;
    gate.step(1000);
    check(gate, 3, 1, 0.5, 1, 1);  // after a match of 3, one token compared and confirmed
    check(gate, 7, 1, 0.5, 0, 1);  // after a match of 7, one compared and not
    const double d       = llama_opt_memo_gate::decay;
    const double prior   = llama_opt_memo_gate::prior_yes;
    const double k       = llama_opt_memo_gate::shrink;
    const double pooled  = (d + 2 * prior) / (d + 1 + 2);
    CHECK(std::abs(gate.chance(7, 1) - k * pooled / (1 + k)) < 1e-12);
    CHECK(std::abs(gate.chance(3, 1) - (1 + k * pooled) / (1 + k)) < 1e-12);  // (faded by its own checks only)
    CHECK(std::abs(gate.chance(5, 1) - pooled) < 1e-12);  // no counts of its own
    CHECK(std::abs(gate.row_steps() - (0.5 * d + 0.5 + llama_opt_memo_gate::prior_row) / (d + 1 + 1)) < 1e-12);
}

// A probe is one token more than the cut, never more than the draft found; each length counts its
// own cut decisions.
static void test_probes_stay_within_the_draft_and_their_length() {
    llama_opt_memo_gate gate;
    gate.step(1000);
    check(gate, 4, 2, 0.6, 2, 50);  // 2 tokens, both confirmed: every draft of 2 goes whole
    for (uint32_t i = 0; i < 2 * llama_opt_memo_gate::probe_every; ++i) {
        CHECK(gate.draft_length(4, 2) == 2 && gate.draft_length(4, 1) == 1);
    }
    check(gate, 5, 1, 1.0, 0, 50);  // after matches of 5 and 6 nothing pays
    for (uint32_t i = 1; i < llama_opt_memo_gate::probe_every; ++i) {
        CHECK(gate.draft_length(5, 8) == 0);
    }
    CHECK(gate.draft_length(6, 8) == 0);   // another length's decision: not 5's probe
    CHECK(gate.draft_length(5, 8) == 1);   // 5's 16th cut decision
}

// A check's noise (a row timed at more than a step) counts as a step a row, and old checks weigh
// less: drafts that pay reopen a length closed by earlier ones.
static void test_the_gate_forgets_old_checks_and_noise() {
    llama_opt_memo_gate gate;
    gate.step(1000);
    gate.checked(5, 1, 100000);  // a preempted check: counted as one step, not 100
    CHECK(gate.row_steps() == (1 + llama_opt_memo_gate::prior_row) / 2);
    check(gate, 5, 4, 1.0, 0, 200);  // four rows at a step each, none confirmed
    CHECK(gate.draft_length(5, 8) == 0);
    check(gate, 5, 2, 0.25, 2, 100);  // then fewer checks of rows at a quarter of a step, confirmed:
    CHECK(gate.draft_length(5, 8) >= 2);  // they outweigh the older ones only as those fade
}

int main() {
    test_the_gate_starts_from_its_priors();
    test_the_gate_cuts_where_a_row_costs_more_than_it_saves();
    test_the_gate_closes_where_no_row_pays();
    test_a_new_length_starts_from_all_lengths();
    test_probes_stay_within_the_draft_and_their_length();
    test_the_chance_is_shrunk_as_documented();
    test_the_gate_forgets_old_checks_and_noise();
    test_a_check_confirms_drafted_tokens_in_order();
    test_an_output_drafts_for_a_history_ending_like_its_prompt();
    test_the_history_wins_unless_an_output_matches_longer();
    test_outputs_are_bounded_oldest_first();
    test_no_draft_without_a_repetition();
    test_draft_follows_the_match();
    test_longest_then_latest_match_wins();
    test_match_is_capped();
    return check_result("test-opt-memo");
}
