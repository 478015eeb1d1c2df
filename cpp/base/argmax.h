#pragma once

// base/argmax: greedy decoding's pick, the index of the first maximum of the logits (what
// llama_sampler_init_greedy and std::max_element pick), without std::max_element's one compare
// and branch per entry: over Gemma 3's 262k logits that loop was a quarter of a millisecond per
// generated token, more than everything else a step does outside the forward pass.

#include <cstddef>
#include <cstdint>

// The smallest i with x[i] == max(x) over finite x; n > 0.
int32_t llama_opt_first_max(const float * x, size_t n);
