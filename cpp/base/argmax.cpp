#include "base/argmax.h"

#include <algorithm>

int32_t llama_opt_first_max(const float * x, size_t n) {
    // Each of L lanes keeps the first maximum of its own entries (a strict compare, as
    // std::max_element's), branch-free so the compiler vectorizes it; the answer is the largest
    // lane value, at the smallest index among equal ones.
    constexpr size_t L = 16;
    if (n < 2 * L) {
        return (int32_t) (std::max_element(x, x + n) - x);
    }
    float   best[L];
    int32_t at[L];
    for (size_t l = 0; l < L; ++l) {
        best[l] = x[l];
        at[l]   = (int32_t) l;
    }
    size_t i = L;
    for (; i + L <= n; i += L) {
        for (size_t l = 0; l < L; ++l) {
            const bool greater = x[i + l] > best[l];
            best[l] = greater ? x[i + l] : best[l];
            at[l]   = greater ? (int32_t) (i + l) : at[l];
        }
    }
    size_t b = 0;
    for (size_t l = 1; l < L; ++l) {
        if (best[l] > best[b] || (best[l] == best[b] && at[l] < at[b])) {
            b = l;
        }
    }
    int32_t first = at[b];
    float   max   = best[b];
    for (; i < n; ++i) {  // the tail: later indices, so only a greater value wins
        if (x[i] > max) {
            max   = x[i];
            first = (int32_t) i;
        }
    }
    return first;
}
