#include "session/logit-adjust.h"

#include "base/types.h"

#include <algorithm>
#include <cmath>
#include <string>

llama_opt_logit_adjust::llama_opt_logit_adjust(int32_t n_vocab, const std::vector<llama_logit_bias> & biases,
                                               const llama_opt_penalties & penalties)
    : n_vocab_(n_vocab) {
    for (const llama_logit_bias & b : biases) {
        if (b.token < 0 || b.token >= n_vocab) {
            throw llama_opt_error(llama_opt_errc::invalid_argument, "logit_bias: token " + std::to_string(b.token) +
                " is outside the vocabulary (0.." + std::to_string(n_vocab - 1) + ")");
        }
        if (!std::isfinite(b.bias)) {
            throw llama_opt_error(llama_opt_errc::invalid_argument,
                "logit_bias: the bias of token " + std::to_string(b.token) + " must be finite");
        }
        biased_.push_back(b.token);
    }
    if (!std::isfinite(penalties.repeat) || penalties.repeat <= 0.0f || !std::isfinite(penalties.frequency) ||
        !std::isfinite(penalties.presence) || penalties.last_n < 0) {
        throw llama_opt_error(llama_opt_errc::invalid_argument,
            "penalties: repeat must be finite and > 0, frequency and presence finite, last_n >= 0");
    }
    if (biases.empty() && !penalties.active()) {
        return;
    }
    chain_ = llama_sampler_chain_init(llama_sampler_chain_default_params());
    if (!biases.empty()) {  // llama.cpp's order (common/sampling): the biases first, then the penalties
        llama_sampler_chain_add(chain_, llama_sampler_init_logit_bias(n_vocab, (int32_t) biases.size(), biases.data()));
    }
    if (penalties.active()) {
        last_n_ = penalties.last_n;
        llama_sampler_chain_add(chain_, llama_sampler_init_penalties(n_vocab, penalties.last_n, penalties.repeat,
                                                                     penalties.frequency, penalties.presence));
    }
}

llama_opt_logit_adjust::~llama_opt_logit_adjust() {
    llama_sampler_free(chain_);
}

void llama_opt_logit_adjust::start(const std::vector<llama_token> & history) {
    recent_.clear();
    if (last_n_ == 0) {
        return;
    }
    llama_sampler_reset(chain_);
    const size_t from = history.size() - std::min(history.size(), (size_t) last_n_);
    for (size_t i = from; i < history.size(); ++i) {
        accept(history[i]);
    }
}

void llama_opt_logit_adjust::accept(llama_token token) {
    if (last_n_ == 0) {
        return;
    }
    llama_sampler_accept(chain_, token);
    recent_.push_back(token);
    if (recent_.size() > (size_t) last_n_) {
        recent_.pop_front();
    }
}

// The chain runs over the entries of the tokens it changes only (each once: the penalties sampler
// would penalize a token listed twice twice), which gives those tokens the logits a run over the
// whole vocabulary gives them.
const float * llama_opt_logit_adjust::apply(const std::vector<float> & logits) {
    if (!chain_) {
        return logits.data();
    }
    touched_.assign(biased_.begin(), biased_.end());
    touched_.insert(touched_.end(), recent_.begin(), recent_.end());
    std::sort(touched_.begin(), touched_.end());
    touched_.erase(std::unique(touched_.begin(), touched_.end()), touched_.end());
    entries_.clear();
    for (llama_token t : touched_) {
        entries_.push_back({ t, logits[t], 0.0f });
    }
    llama_token_data_array cur = { entries_.data(), entries_.size(), -1, false };
    llama_sampler_apply(chain_, &cur);
    adjusted_ = logits;
    for (const llama_token_data & e : entries_) {
        adjusted_[e.id] = e.logit;
    }
    return adjusted_.data();
}
