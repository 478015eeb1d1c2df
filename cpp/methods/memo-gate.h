#pragma once

// methods/memo-gate: how much of a memo draft to check on this model and machine. A drafted token
// is one more row of the check's batch and costs part of a decode step: about a tenth to a half on
// Gemma 3 270M, whose 262k-entry output layer dominates a step and is read once for all rows, but
// ~0.8 on SmolLM2-135M and Qwen2.5-Coder-0.5B at chat depths, whose steps are mostly attention
// (per row) or arithmetic-bound matrix products (docs/memo.md). Only a drafted token that sampling
// confirms saves a step, and the i-th is confirmed only if the ones before it were. So the gate
// prices a row in steps (the time drafted rows added to their passes over a plain step's: decayed
// over the last ~50 checks), estimates per match length and place in the draft how often a drafted
// token that sampling compared is confirmed (each length's own counts, shrunk toward all lengths'
// while it has few), and checks the longest prefix of the draft whose every token's chance to be
// reached and confirmed (the product over its place and those before) is above a row's cost. One
// cut decision in probe_every per length checks one token more, to keep measuring what the pricing
// cut. It decides how fast, never what: with or without a draft, every token is plain decoding's
// (Tier 1).

#include "base/numerics.h"

#include <array>
#include <cstdint>
#include <mutex>

class llama_opt_memo_gate {
public:
    static constexpr uint32_t probe_every = 16;    // one cut decision in this many per length: a token more
    static constexpr double   decay       = 0.98;  // per check (of all, and of the length)
    // before counts of its own, a length's chance of a place weighs like this many drafts at all
    // lengths' chance; and before any check, a row is priced at half a step, and a token reached
    // is confirmed 4 times in 5 (so that the first drafts are checked and measured)
    static constexpr double shrink      = 4;
    static constexpr double prior_row   = 0.5;
    static constexpr double prior_yes   = 0.8;

    // How many of the first `max_tokens` tokens of a draft found after a match of `match` tokens
    // to check (0: none).
    uint32_t draft_length(uint32_t match, uint32_t max_tokens);
    void step(uint64_t us);  // a plain one-row decode step took `us`
    // a check of `n_drafted` tokens after a match of `match`: its drafted rows added `added_us`
    // to the pass (a row is counted at most a step: more is the machine's noise, a preemption)
    void checked(uint32_t match, uint32_t n_drafted, double added_us);
    // sampling compared the `place`-th (1-based) token drafted after a match of `match` (every one
    // before it was confirmed) and confirmed it or not
    void compared(uint32_t match, uint32_t place, bool confirmed);
    double step_us() const;  // decayed mean time of a plain step (0: none yet)
    double row_steps() const;  // what a drafted row costs, in plain steps
    // how often the `place`-th drafted token after a match of `match`, compared, is confirmed
    double chance(uint32_t match, uint32_t place) const;

private:
    struct tally {
        double compared  = 0;  // drafted tokens at this place sampling compared (all before confirmed)
        double confirmed = 0;
    };
    using places = std::array<tally, LLAMA_OPT_MEMO_MATCH_MAX + 1>;  // [place], 1-based
    static uint32_t length_of(uint32_t match) { return match < LLAMA_OPT_MEMO_MATCH_MAX ? match : LLAMA_OPT_MEMO_MATCH_MAX; }
    static void     fade(places & p);
    double          row_steps_locked() const;
    double          chance_locked(uint32_t length, uint32_t place) const;

    mutable std::mutex                                   mutex_;
    double                                               step_us_   = 0;
    double                                               row_cost_  = 0;  // decayed steps drafted rows added
    double                                               rows_      = 0;  // decayed drafted rows
    places                                               all_{};          // every length's
    std::array<places, LLAMA_OPT_MEMO_MATCH_MAX + 1>     by_match_{};
    std::array<uint32_t, LLAMA_OPT_MEMO_MATCH_MAX + 1>   since_probe_{};  // decisions since a length's last probe
};
