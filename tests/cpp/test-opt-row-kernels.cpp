// methods/row-kernels: each (weight type, rows) cell takes the arm its own timings say is faster,
// tries both first, keeps measuring the slower one, and follows the machine when it changes.

#include "check.h"
#include "methods/row-kernels.h"

#include <cstring>

namespace {

constexpr size_t n_types = 8;
constexpr uint32_t q8_0 = 3, q6_K = 5;  // two cells' types (any index: the chooser knows no names)

using times = llama_opt_row_kernels::row_times;

bool multi_at(const uint32_t * masks, uint32_t type, uint32_t rows) { return masks[type] >> rows & 1; }

// One decode whose matrix products of `rows` rows on `type` took `multi_ns` or `one_ns` (per 1000
// weight elements) on the arm the chooser gave; returns that arm.
bool decode(llama_opt_row_kernels & chooser, uint32_t type, uint32_t rows, double multi_ns, double one_ns) {
    uint32_t masks[n_types];
    chooser.table(masks, n_types);
    times ns[n_types] = {}, work[n_types] = {};
    const bool multi = multi_at(masks, type, rows);
    work[type][rows] = 1000;
    ns[type][rows]   = (uint64_t) (multi ? multi_ns : one_ns);
    chooser.measured(masks, ns, work, n_types);
    return multi;
}

}  // namespace

// Untried, a cell alternates its arms (multi-row first) until each has warmup samples.
static void test_a_new_cell_tries_both_arms() {
    llama_opt_row_kernels chooser;
    bool arms[2 * llama_opt_row_kernels::warmup];
    for (bool & arm : arms) {
        arm = decode(chooser, q8_0, 2, 2000, 1000);
    }
    for (uint32_t i = 0; i < 2 * llama_opt_row_kernels::warmup; ++i) {
        CHECK(arms[i] == (i % 2 == 0));
    }
}

// Per cell: multi-row twice as slow at (q8_0, 2 rows) and 0.8 x at (q8_0, 8 rows) clears bit 2 and
// sets bit 8 of q8_0's mask; other cells (q6_K, never measured) keep the multi-row default.
static void test_each_cell_takes_its_faster_arm() {
    llama_opt_row_kernels chooser;
    for (int i = 0; i < 10; ++i) {
        decode(chooser, q8_0, 2, 2000, 1000);
        decode(chooser, q8_0, 8, 800, 1000);
    }
    uint32_t masks[n_types];
    chooser.table(masks, n_types);
    CHECK(!multi_at(masks, q8_0, 2));
    CHECK(multi_at(masks, q8_0, 8));
    CHECK(masks[q6_K] == 0x1fffeu);  // rows 1..16, all multi-row
    bool seen2 = false, seen8 = false;
    for (const auto & c : chooser.report()) {
        if (c.type == q8_0 && c.rows == 2) {
            seen2 = true;
            CHECK(!c.multi && c.multi_arm.ns_per_work == 2.0 && c.one_arm.ns_per_work == 1.0);
        }
        seen8 |= c.type == q8_0 && c.rows == 8 && c.multi;
    }
    CHECK(seen2 && seen8);
    CHECK(chooser.report().size() == 2);
}

// Warm, the slower arm gets exactly one decode in probe_every.
static void test_the_slower_arm_is_probed_once_in_probe_every() {
    llama_opt_row_kernels chooser;
    for (uint32_t i = 0; i < 2 * llama_opt_row_kernels::warmup; ++i) {
        decode(chooser, q8_0, 4, 2000, 1000);
    }
    uint32_t multi = 0;
    const uint32_t n = 10 * llama_opt_row_kernels::probe_every;
    for (uint32_t i = 0; i < n; ++i) {
        multi += decode(chooser, q8_0, 4, 2000, 1000);
    }
    CHECK(multi == 10);
}

// When the machine changes (another process, another CPU state) the choice follows within a few
// probes; one spike of 10 x on the faster arm does not flip it.
static void test_the_choice_follows_the_times_but_not_a_spike() {
    llama_opt_row_kernels chooser;
    for (int i = 0; i < 40; ++i) {
        decode(chooser, q8_0, 2, 2000, 1000);
    }
    for (int i = 0; i < 2 && decode(chooser, q8_0, 2, 2000, 1000); ++i) {  // up to the faster arm's turn
    }
    decode(chooser, q8_0, 2, 2000, 50000);  // that one preempted: counted as twice its mean, not 50 x
    uint32_t masks[n_types];
    chooser.table(masks, n_types);
    CHECK(!multi_at(masks, q8_0, 2));
    // now multi-row is the faster one: the probes see it, and the choice flips
    for (uint32_t i = 0; i < 4 * llama_opt_row_kernels::probe_every; ++i) {
        decode(chooser, q8_0, 2, 500, 1000);
    }
    uint32_t multi = 0;
    for (uint32_t i = 0; i < llama_opt_row_kernels::probe_every; ++i) {
        multi += decode(chooser, q8_0, 2, 500, 1000);
    }
    CHECK(multi == llama_opt_row_kernels::probe_every - 1);
}

int main() {
    test_a_new_cell_tries_both_arms();
    test_each_cell_takes_its_faster_arm();
    test_the_slower_arm_is_probed_once_in_probe_every();
    test_the_choice_follows_the_times_but_not_a_spike();
    return check_result("test-opt-row-kernels");
}
