#pragma once

// llama-opt-spec-prefill: speculative prefill's draft scorer (specification 001, Tier 2). A
// separate, smaller model with the target's vocabulary computes the whole prompt; the last
// token's queries of its layers against all the prompt's keys (llama-opt-attn-capture's scorer
// mode, llama-opt-attn's arithmetic) say which tokens the target computes. The other scorer, the
// target's own first layers, is llama_opt_context::score_span.

#include "llama-opt-attn-capture.h"
#include "llama-opt-model.h"
#include "llama-opt.h"

#include <memory>
#include <string>
#include <vector>

struct llama_context;

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
