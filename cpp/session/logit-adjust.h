#pragma once

// session/logit-adjust: the first stage of sampling, before the grammar's mask and the sampler
// chain: the request's logit biases, then the repetition penalties over the last tokens of the
// history (the prompt's included, as llama-server feeds them). Both are llama.cpp's own samplers
// (logit_bias, penalties), applied to the few logits they change, in a copy of the logits: a
// greedy pick, the grammar's fast masking and its forced tokens then work on the adjusted logits
// unchanged. A token the grammar forces is taken whatever its bias (a finite bias cannot make
// the only allowed token lose: llama.cpp picks it too).

#include "llama.h"

#include <cstdint>
#include <deque>
#include <vector>

struct llama_opt_penalties {
    float   repeat    = 1.0f;  // a repeated token's logit divided by it (multiplied, if negative); 1: off
    float   frequency = 0.0f;  // subtracted once per occurrence; 0: off
    float   presence  = 0.0f;  // subtracted once if it occurred; 0: off
    int32_t last_n    = 64;    // the tokens looked back over; 0: off

    bool active() const { return last_n > 0 && (repeat != 1.0f || frequency != 0.0f || presence != 0.0f); }
};

class llama_opt_logit_adjust {
public:
    // Throws llama_opt_error(invalid_argument) for a bias of a token outside [0, n_vocab), a
    // non-finite value or a repeat penalty <= 0.
    llama_opt_logit_adjust(int32_t n_vocab, const std::vector<llama_logit_bias> & biases,
                           const llama_opt_penalties & penalties);
    ~llama_opt_logit_adjust();

    llama_opt_logit_adjust(const llama_opt_logit_adjust &)             = delete;
    llama_opt_logit_adjust & operator=(const llama_opt_logit_adjust &) = delete;

    bool active() const { return chain_ != nullptr; }
    // A generation starts after `history`: the penalties look back over its last tokens.
    void start(const std::vector<llama_token> & history);
    // A token joined the history.
    void accept(llama_token token);
    // The logits adjusted (`logits` itself when nothing is); valid until the next call.
    const float * apply(const std::vector<float> & logits);

private:
    int32_t                          n_vocab_;
    int32_t                          last_n_ = 0;         // the penalties' window (0: no penalties)
    std::vector<llama_token>         biased_;             // the tokens with a bias
    llama_sampler *                  chain_  = nullptr;   // logit_bias, penalties; null: nothing to do
    std::deque<llama_token>          recent_;             // the penalties' window: the tokens it changes
    std::vector<float>               adjusted_;           // the adjusted copy of the logits
    std::vector<llama_token>         touched_;            // the tokens whose logits change, once each
    std::vector<llama_token_data>    entries_;            // their logits, through the chain
};
