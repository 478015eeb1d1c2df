#include "methods/spec-prefill.h"

#include "engine/context.h"
#include "engine/log.h"
#include "llama.h"

#include <algorithm>

llama_opt_spec_draft::llama_opt_spec_draft(const std::string & path, const llama_opt_model & target, uint32_t n_ctx,
                                           uint32_t n_batch, int32_t n_threads)
    : model_(std::make_unique<llama_opt_model>(path, llama_opt_model_params{})), n_batch_(std::max(1u, n_batch)) {
    bool same_vocab = model_->n_vocab() == target.n_vocab();
    for (llama_token t = 0; same_vocab && t < target.n_vocab(); ++t) {
        same_vocab = model_->token_piece(t, true) == target.token_piece(t, true);
    }
    if (!same_vocab) {
        throw llama_opt_error(llama_opt_errc::invalid_argument,
            "spec_prefill_draft_model='" + path + "' does not share the model's vocabulary (" +
            std::to_string(model_->n_vocab()) + " vs " + std::to_string(target.n_vocab()) +
            " tokens, or different token texts): use a draft of the same model family, or leave it empty to "
            "score with the model's own first layers", "spec_prefill_draft_model");
    }
    capture_ = std::make_unique<llama_opt_attn_capture>(model_->get(), 1);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx             = n_ctx;
    cp.n_batch           = n_batch_;
    cp.n_ubatch          = n_batch_;
    cp.n_seq_max         = 1;
    cp.n_threads         = n_threads;
    cp.n_threads_batch   = n_threads;
    cp.no_perf           = true;
    cp.cb_eval           = &llama_opt_attn_capture::callback;
    cp.cb_eval_user_data = capture_.get();
    llama_opt_log_take_errors();
    ctx_ = llama_init_from_model(model_->get(), cp);
    if (!ctx_) {
        const std::string why = llama_opt_log_take_errors();
        throw llama_opt_error(llama_opt_errc::invalid_argument,
            "llama.cpp could not create the draft model's context" + (why.empty() ? "" : ":\n" + why),
            "spec_prefill_draft_model");
    }
}

llama_opt_spec_draft::~llama_opt_spec_draft() {
    if (ctx_) {
        llama_free(ctx_);
    }
}

std::vector<float> llama_opt_spec_draft::importance(const llama_token * tokens, size_t n, uint32_t window,
                                                    uint32_t last_layers, uint32_t pool, uint64_t & passes) {
    llama_memory_clear(llama_get_memory(ctx_), true);
    capture_->arm_scorer((uint32_t) model_->n_layer(), 0, n, window);
    llama_batch batch = llama_batch_init((int32_t) n_batch_, 0, 1);
    int32_t     rc    = 0;
    for (size_t pos = 0; pos < n && rc == 0; pos += n_batch_) {
        batch.n_tokens = (int32_t) std::min<size_t>(n_batch_, n - pos);
        for (int32_t i = 0; i < batch.n_tokens; ++i) {
            batch.token[i]     = tokens[pos + i];
            batch.pos[i]       = (llama_pos) (pos + i);
            batch.n_seq_id[i]  = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i]    = false;
        }
        capture_->new_call();
        rc = llama_decode(ctx_, batch);
        passes += 1;
    }
    llama_batch_free(batch);
    capture_->disarm_scorer();
    llama_memory_clear(llama_get_memory(ctx_), true);
    if (rc != 0) {
        const std::string why = llama_opt_log_take_errors();
        throw llama_opt_error(llama_opt_errc::decode_failed,
            "the draft model (spec_prefill_draft_model) failed to compute the prompt: llama_decode returned " +
            std::to_string(rc) + (why.empty() ? "" : ":\n" + why));
    }
    const std::vector<llama_opt_spec_layer> layers = capture_->scorer_layers();
    if (layers.empty()) {
        return {};
    }
    return llama_opt_spec_importance(capture_->shape(), layers, n, window, last_layers, pool);
}

std::vector<float> llama_opt_spec_score_span(llama_opt_context & ctx, int32_t seq, const llama_token * tokens,
                                             size_t begin, size_t end, uint32_t n_layers, uint32_t window,
                                             uint32_t last_layers, uint32_t pool, bool evict_sessions,
                                             llama_opt_work & work) {
    ctx.check_open();
    llama_opt_attn_capture * capture = ctx.attn_capture();
    if (!capture) {
        throw llama_opt_error(llama_opt_errc::invalid_argument,
            "speculative prefill with the model's own layers needs a context made with spec_prefill_enabled (the "
            "model's queries and keys are observed through the eval callback, set when the context is made)",
            "spec_prefill_enabled");
    }
    capture->arm_scorer(n_layers, (llama_pos) begin, end - begin, window);
    try {
        ctx.compute_span(seq, tokens, begin, end, nullptr, evict_sessions, work);
    } catch (...) {
        capture->disarm_scorer();
        throw;
    }
    capture->disarm_scorer();
    ctx.memory().remove(seq, (llama_pos) begin, -1);  // their KV stops at the scorer's layers
    const std::vector<llama_opt_spec_layer> layers = capture->scorer_layers();
    if (layers.empty()) {
        return {};
    }
    return llama_opt_spec_importance(capture->shape(), layers, end - begin, window, last_layers, pool);
}
