#include "methods/grammar-vocab.h"

#include "llama-vocab.h"  // llama.cpp's internal vocabulary (src/): token_to_piece by reference

llama_opt_grammar_vocab::llama_opt_grammar_vocab(const llama_vocab * vocab)
    : vocab_(vocab), n_tokens_((size_t) llama_vocab_n_tokens(vocab)), by_first_byte_(256), by_first_two_(256 * 257) {
    for (llama_token t = 0; t < (llama_token) n_tokens_; ++t) {
        const std::string & piece = vocab->token_to_piece(t);
        if (!piece.empty()) {
            by_first_byte_[(uint8_t) piece[0]].push_back(t);
            by_first_two_[(uint8_t) piece[0] * 257 + (piece.size() > 1 ? (uint8_t) piece[1] + 1 : 0)].push_back(t);
        }
        if (llama_vocab_is_eog(vocab, t)) {
            eog_.push_back(t);
        }
    }
}

llama_opt_grammar_vocab::token_list llama_opt_grammar_vocab::allowed(uint64_t state) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = allowed_.find(state);
    return it == allowed_.end() ? nullptr : it->second;
}

void llama_opt_grammar_vocab::remember_allowed(uint64_t state, token_list tokens) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (allowed_total_ + tokens->size() > (size_t{ 1 } << 24)) {  // 64 MiB at most; recomputed when needed
        allowed_.clear();
        allowed_total_ = 0;
    }
    allowed_total_ += tokens->size();
    allowed_[state] = std::move(tokens);
}

bool llama_opt_grammar_vocab::forced(uint64_t state, llama_token & token) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = forced_.find(state);
    if (it == forced_.end()) {
        return false;
    }
    token = it->second;
    return true;
}

void llama_opt_grammar_vocab::remember_forced(uint64_t state, llama_token token) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (forced_.size() >= (size_t{ 1 } << 20)) {
        forced_.clear();
    }
    forced_[state] = token;
}
