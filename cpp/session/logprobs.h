#pragma once

// session/logprobs: what a row of logits says of a token. The distribution is the model's own:
// the log-softmax of the raw logits a step or a prompt row computed, before the request's logit
// biases, repetition penalties, the grammar's mask and the temperature (vLLM's default,
// "raw_logprobs"), so a value does not depend on how the token was picked. The sum runs in one
// fixed order: the same logits always give the same bits.

#include "llama.h"

#include <cstdint>
#include <utility>
#include <vector>

// the most alternatives a row reports (OpenAI's limit for chat's top_logprobs)
constexpr int32_t LLAMA_OPT_TOP_LOGPROBS_MAX = 20;

struct llama_opt_token_logprob {
    llama_token token   = -1;
    double      logprob = 0.0;
    // the top_n most likely tokens and their log-probabilities, most likely first (ties: lower id first)
    std::vector<std::pair<llama_token, double>> top;
};

// `token`'s log-probability under `logits` (n_vocab of them) and the `top_n` most likely tokens
// (0..LLAMA_OPT_TOP_LOGPROBS_MAX, else llama_opt_error(invalid_argument)).
llama_opt_token_logprob llama_opt_logprob_of(const float * logits, int32_t n_vocab, llama_token token, int32_t top_n);

// Throws llama_opt_error(invalid_argument) unless 0 <= top_n <= LLAMA_OPT_TOP_LOGPROBS_MAX.
void llama_opt_check_top_logprobs(int32_t top_n);
