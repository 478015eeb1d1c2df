// llama_opt_first_max picks what std::max_element picks (greedy decoding's first maximum) at every
// length around the lane width and with many ties, which is where a lane-wise search could pick a
// later equal maximum.

#include "check.h"
#include "base/argmax.h"

#include <algorithm>
#include <random>
#include <vector>

static int32_t reference(const std::vector<float> & x) {
    return (int32_t) (std::max_element(x.begin(), x.end()) - x.begin());
}

static void test_equal_to_max_element_on_ties_and_every_tail() {
    std::mt19937                    rng(7);
    std::uniform_int_distribution<> few(-3, 3);  // small integers: the maximum repeats often
    std::normal_distribution<float> wide(0.0f, 4.0f);
    for (size_t n = 1; n <= 200; ++n) {
        for (int rep = 0; rep < 50; ++rep) {
            std::vector<float> x(n);
            for (float & v : x) {
                v = rep % 2 ? (float) few(rng) : wide(rng);
            }
            CHECK(llama_opt_first_max(x.data(), n) == reference(x));
        }
    }
}

static void test_the_first_of_equal_maxima_in_different_lanes() {
    std::vector<float> x(262144, -1.0f);
    x[70000] = 5.0f;  // lane 0 ... and later the same value in lanes before and after it
    x[70001] = 5.0f;
    x[80015] = 5.0f;
    x[3]     = 4.0f;
    CHECK(llama_opt_first_max(x.data(), x.size()) == 70000);
    x[262143] = 5.0f;  // the tail, beyond the last whole group of lanes when n is not a multiple
    CHECK(llama_opt_first_max(x.data(), 262143 + 1) == 70000);
    x[262140] = 6.0f;
    CHECK(llama_opt_first_max(x.data(), x.size()) == 262140);
}

int main() {
    test_equal_to_max_element_on_ties_and_every_tail();
    test_the_first_of_equal_maxima_in_different_lanes();
    return check_result("test-opt-argmax");
}
