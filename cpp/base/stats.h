#pragma once

// base/stats: the counters of the optimization layer and of the engine's work. The list of
// counters is written once, in base/counters.def.

#include <cstdint>
#include <string>
#include <vector>

struct llama_opt_stats {
#define LLAMA_OPT_COUNTER(name) uint64_t name = 0;
#include "base/counters.def"
#undef LLAMA_OPT_COUNTER

    void reset() { *this = llama_opt_stats(); }

    llama_opt_stats & operator+=(const llama_opt_stats & other);
    llama_opt_stats   operator-(const llama_opt_stats & other) const;

    std::string to_string() const;  // human-readable, one group per line
    void        print() const;      // to_string() to stderr
};

struct llama_opt_stats_field {
    const char *                name;
    uint64_t llama_opt_stats::* member;
};

// Every counter, in base/counters.def's order.
const std::vector<llama_opt_stats_field> & llama_opt_stats_fields();
