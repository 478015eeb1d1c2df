#pragma once

// methods/memo-gate: whether checking a memo draft pays on this model and machine. A drafted token
// is one more row of the check's batch and costs part of a decode step: about half on Gemma 3 270M,
// whose 262k-entry output layer dominates a step and is read once for all rows, but ~0.8 on
// Qwen2.5-Coder-0.5B, whose matrix products are bound by arithmetic at a few rows on this CPU
// (docs/memo.md). Only a drafted token that sampling confirms saves a step, and how many are
// confirmed depends on how long a match the draft came from. So the gate weighs, per match length,
// the time drafted rows added to their passes against the steps their confirmed tokens saved
// (decayed sums: the last ~50 checks of that length weigh); while the rows cost more than they
// saved, only one draft in probe_every of that length goes through, to keep measuring. It decides
// how fast, never what: with or without a draft, every token is plain decoding's (Tier 1).

#include "base/numerics.h"

#include <array>
#include <cstdint>
#include <mutex>

class llama_opt_memo_gate {
public:
    static constexpr uint32_t probe_every = 16;    // a closed length lets one draft in this many through
    static constexpr double   decay       = 0.98;  // per check of a length

    // Whether a draft found after a match of `match` tokens should be checked (a refusal counts
    // toward that length's next probe).
    bool open(uint32_t match);
    void step(uint64_t us);                     // a plain one-row decode step took `us`
    // a check of `n_drafted` tokens after a match of `match`: its drafted rows added `added_us`
    // to the pass (a row is counted at most a step: more is the machine's noise, a preemption)
    void checked(uint32_t match, uint32_t n_drafted, double added_us);
    void confirmed(uint32_t match);             // a drafted token was confirmed: a step saved
    double step_us() const;                     // decayed mean time of a plain step (0: none yet)

private:
    struct weighed {
        double   cost_us  = 0;  // time drafted rows added
        double   saved_us = 0;  // steps confirmed tokens saved
        uint32_t refused  = 0;  // drafts refused since the last let through
    };
    static uint32_t length_of(uint32_t match) { return match < LLAMA_OPT_MEMO_MATCH_MAX ? match : LLAMA_OPT_MEMO_MATCH_MAX; }

    mutable std::mutex                                mutex_;
    double                                            step_us_ = 0;
    std::array<weighed, LLAMA_OPT_MEMO_MATCH_MAX + 1> by_match_{};
};
