#pragma once

// methods/spec-prefill: speculative prefill's scorers (specification 001, Tier 2): which tokens
// of a prompt the target computes, said by the last token's queries of some layers against all
// the prompt's keys (methods/attn-capture's scorer mode, methods/attn-score's arithmetic). Either a
// draft (llama_opt_spec_draft: a separate, smaller model with the target's vocabulary computes the
// whole prompt) or the target's own first layers (llama_opt_spec_score_span, on the context).

#include "methods/attn-capture.h"
#include "engine/model.h"
#include "base/types.h"

#include <memory>
#include <string>
#include <vector>

struct llama_context;
class llama_opt_context;
struct llama_opt_work;

class llama_opt_spec_draft {
public:
    // Loads the draft (llama_opt_error model_load) and checks that its vocabulary is the
    // target's, token for token (invalid_argument otherwise).
    llama_opt_spec_draft(const std::string & path, const llama_opt_model & target, uint32_t n_ctx, uint32_t n_batch,
                         int32_t n_threads);
    ~llama_opt_spec_draft();

    llama_opt_spec_draft(const llama_opt_spec_draft &)             = delete;
    llama_opt_spec_draft & operator=(const llama_opt_spec_draft &) = delete;

    // 001's importance of tokens[0, n) (llama_opt_spec_importance over the draft's layers). The
    // draft keeps no KV between calls: each prompt is computed whole. `passes`: llama_decode calls.
    std::vector<float> importance(const llama_token * tokens, size_t n, uint32_t window, uint32_t last_layers,
                                  uint32_t pool, uint64_t & passes);

    const llama_opt_model & model() const { return *model_; }

private:
    std::unique_ptr<llama_opt_model>        model_;
    llama_context *                         ctx_ = nullptr;
    std::unique_ptr<llama_opt_attn_capture> capture_;
    uint32_t                                n_batch_;
};

// 001's importance of tokens[begin, end) scored by the target's first `n_layers` layers on `seq`
// of `ctx` (on top of its KV of [0, begin), which must end there): the span is computed up to
// those layers (llama_opt_context::compute_span, evicting as it says, with the capture armed as a
// scorer), and its cells removed again. Empty if the scorer saw no query (a model whose tensors it
// does not know). A context made without the capture (spec_prefill_enabled): invalid_argument.
std::vector<float> llama_opt_spec_score_span(llama_opt_context & ctx, int32_t seq, const llama_token * tokens,
                                             size_t begin, size_t end, uint32_t n_layers, uint32_t window,
                                             uint32_t last_layers, uint32_t pool, bool evict_sessions,
                                             llama_opt_work & work);
