#pragma once

// methods/grammar-vocab: what grammars (methods/grammar) learn about one model's
// vocabulary: its tokens indexed by the first bytes of their text, and the answers that needed
// a scan, remembered per grammar state and shared by all grammars on that model: states recur
// (every element of an array, every turn of an agent that sends the same tool schema).

#include "llama.h"

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

// One per model (llama_opt_model owns it), so token ids never leak between vocabularies.
class llama_opt_grammar_vocab {
public:
    explicit llama_opt_grammar_vocab(const llama_vocab * vocab);

    const llama_vocab *              vocab() const { return vocab_; }
    int32_t                          n_tokens() const { return (int32_t) n_tokens_; }
    const std::vector<llama_token> & starting_with(uint8_t byte) const { return by_first_byte_[byte]; }
    // tokens whose text starts with these two bytes; second = -1: the one-byte tokens `byte`
    const std::vector<llama_token> & starting_with(uint8_t byte, int second) const {
        return by_first_two_[byte * 257 + second + 1];
    }
    const std::vector<llama_token> & eog() const { return eog_; }

    using token_list = std::shared_ptr<const std::vector<llama_token>>;
    // the allowed tokens of a grammar state (by llama_opt_grammar::state_key), if remembered
    token_list allowed(uint64_t state) const;
    void       remember_allowed(uint64_t state, token_list tokens);
    // the only allowed token of a state (-1: several, -2: none), if remembered
    bool forced(uint64_t state, llama_token & token) const;
    void remember_forced(uint64_t state, llama_token token);

private:
    const llama_vocab *                   vocab_;
    size_t                                n_tokens_;
    std::vector<std::vector<llama_token>> by_first_byte_;  // by the first byte of the token's text
    std::vector<std::vector<llama_token>> by_first_two_;   // by its first two bytes (see starting_with)
    std::vector<llama_token>              eog_;

    mutable std::mutex                         mutex_;
    std::unordered_map<uint64_t, token_list>  allowed_;
    size_t                                     allowed_total_ = 0;  // tokens held by allowed_
    std::unordered_map<uint64_t, llama_token> forced_;
};
