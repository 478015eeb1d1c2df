#pragma once

// methods/h2o-prefill: H2O chunked sparse prefill on a context (docs/h2o.md, Tier 2). A prompt is
// computed in chunks of h2o_chunk_size tokens; in each, every full-attention layer attends to the
// chunk and to its memory set (the local window and the heavy hitters, patches/0010), and the
// chunk's softmax column sums (methods/h2o-capture) update the scores that choose the next memory
// set (methods/h2o). The KV of every token is stored, so the session's history is whole.

#include "engine/context.h"

#include <cstdint>
#include <vector>

// What an H2O prefill did, for the statistics.
struct llama_opt_h2o_work {
    uint64_t chunks      = 0;  // chunks computed with attention subsets
    uint64_t tokens_kept = 0;  // memory-set entries, summed over chunks, layers and heads
    uint64_t select_us   = 0;  // time in subsets, score updates and memory-set construction
};

// Computes tokens[0, end) of `seq`, which has no KV, in H2O chunks, with the logits of the last
// token into `logits` (if not null). Nothing is evicted for room. On failure the KV of the
// sequence is removed and llama_opt_error is thrown; the work done until then is in `work` and
// `h2o_work`. A context made without h2o_enabled: llama_opt_error(feature_unavailable).
void llama_opt_h2o_prefill(llama_opt_context & ctx, int32_t seq, const llama_token * tokens, size_t end,
                           std::vector<float> * logits, llama_opt_work & work, llama_opt_h2o_work & h2o_work);
