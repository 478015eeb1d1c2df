#include "llama-opt-session.h"

#include "llama-opt-context.h"

#include <cstdio>

llama_opt_session::llama_opt_session(std::shared_ptr<llama_opt_context> ctx, int32_t seq)
    : ctx_(std::move(ctx)), seq_(seq) {
    set_sampling(llama_opt_sampling());
}

llama_opt_session::~llama_opt_session() {
    close();
    llama_sampler_free(sampler_);
}

bool llama_opt_session::closed() const {
    return closed_ || ctx_->closed();
}

void llama_opt_session::check_open() const {
    if (closed()) {
        throw llama_opt_error(llama_opt_errc::session_closed,
            "this session is closed; open a new one with context.session()");
    }
}

void llama_opt_session::close() {
    if (!closed_) {
        closed_ = true;
        ctx_->release(seq_);
    }
}

size_t llama_opt_session::room() const {
    return ctx_->n_ctx() > tokens_.size() ? ctx_->n_ctx() - tokens_.size() : 0;
}

void llama_opt_session::evaluate_pending(uint64_t llama_opt_stats::* counter) {
    if (n_evaluated_ < tokens_.size()) {
        ctx_->decode(seq_, tokens_, n_evaluated_, tokens_.size(), logits_, stats_, counter);
        n_evaluated_ = tokens_.size();
        logits_for_  = n_evaluated_;
    }
}

void llama_opt_session::ensure_logits(uint64_t llama_opt_stats::* counter) {
    evaluate_pending(counter);
    if (logits_for_ != n_evaluated_ && n_evaluated_ > 0) {
        // the history was cut back: recompute its last token to get its logits
        ctx_->forget(seq_, n_evaluated_ - 1);
        n_evaluated_ -= 1;
        evaluate_pending(counter);
    }
}

const std::vector<float> & llama_opt_session::logits() {
    check_open();
    ensure_logits(&llama_opt_stats::tokens_prefilled);
    return logits_;
}

void llama_opt_session::check_fits(size_t n_tokens) const {
    if (n_tokens > ctx_->n_ctx()) {
        throw llama_opt_error(llama_opt_errc::context_overflow,
            "the session would hold " + std::to_string(n_tokens) + " tokens, more than the context size n_ctx=" +
            std::to_string(ctx_->n_ctx()) + "; start a new session or create the Context with a larger n_ctx", "n_ctx");
    }
}

void llama_opt_session::sync(const std::vector<llama_token> & tokens) {
    check_open();
    ctx_->model().check_tokens(tokens.data(), tokens.size());
    check_fits(tokens.size());

    size_t common = 0;  // only tokens with KV count: a pending token has none yet
    while (common < n_evaluated_ && common < tokens.size() && tokens_[common] == tokens[common]) {
        ++common;
    }
    ctx_->count(stats_, &llama_opt_stats::diff_tokens_total, tokens.size());
    ctx_->count(stats_, &llama_opt_stats::diff_tokens_unchanged, common);
    ctx_->count(stats_, &llama_opt_stats::diff_tokens_recomputed, tokens.size() - common);
    if (common < n_evaluated_) {
        ctx_->forget(seq_, common);
        n_evaluated_ = common;
    }
    tokens_ = tokens;
    try {
        evaluate_pending(&llama_opt_stats::tokens_prefilled);
    } catch (...) {
        tokens_.resize(n_evaluated_);
        throw;
    }
}

void llama_opt_session::append(const std::vector<llama_token> & tokens) {
    check_open();
    ctx_->model().check_tokens(tokens.data(), tokens.size());
    check_fits(tokens_.size() + tokens.size());
    const size_t old_size = tokens_.size();
    tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
    try {
        evaluate_pending(&llama_opt_stats::tokens_prefilled);
    } catch (...) {
        tokens_.resize(old_size);  // decode() already removed the new KV
        throw;
    }
}

void llama_opt_session::set_sampling(const llama_opt_sampling & s) {
    llama_sampler * chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
    if (s.temperature <= 0.0f) {
        llama_sampler_chain_add(chain, llama_sampler_init_greedy());
    } else {
        if (s.top_k > 0) {
            llama_sampler_chain_add(chain, llama_sampler_init_top_k(s.top_k));
        }
        if (s.top_p < 1.0f) {
            llama_sampler_chain_add(chain, llama_sampler_init_top_p(s.top_p, 1));
        }
        if (s.min_p > 0.0f) {
            llama_sampler_chain_add(chain, llama_sampler_init_min_p(s.min_p, 1));
        }
        llama_sampler_chain_add(chain, llama_sampler_init_temp(s.temperature));
        llama_sampler_chain_add(chain, llama_sampler_init_dist(s.seed));
    }
    llama_sampler_free(sampler_);
    sampler_ = chain;
}

llama_token llama_opt_session::next_token() {
    check_open();
    if (room() == 0) {
        throw llama_opt_error(llama_opt_errc::context_overflow,
            "the session fills the context (n_ctx=" + std::to_string(ctx_->n_ctx()) + ")", "n_ctx");
    }
    if (tokens_.empty()) {
        throw llama_opt_error(llama_opt_errc::invalid_argument,
            "the session is empty: append a prompt before generating");
    }
    ensure_logits(&llama_opt_stats::tokens_decoded);

    candidates_.resize(logits_.size());
    for (size_t i = 0; i < logits_.size(); ++i) {
        candidates_[i] = { (llama_token) i, logits_[i], 0.0f };
    }
    llama_token_data_array cur = { candidates_.data(), candidates_.size(), -1, false };
    llama_sampler_apply(sampler_, &cur);
    const llama_token token = cur.data[cur.selected].id;
    llama_sampler_accept(sampler_, token);

    tokens_.push_back(token);
    ctx_->count(stats_, &llama_opt_stats::tokens_generated, 1);
    return token;
}

void llama_opt_session::end_turn() {
    if (ctx_->settings().config.stats_enabled) {
        (stats_ - turn_start_).print();
    }
    turn_start_ = stats_;
}
