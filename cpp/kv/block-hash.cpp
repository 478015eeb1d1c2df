#include "kv/block-hash.h"

#include <algorithm>

static inline uint64_t fnv1a_byte(uint64_t state, uint8_t byte) {
    return (state ^ byte) * LLAMA_OPT_FNV_PRIME;
}

void llama_opt_hasher::feed(llama_token token) {
    const uint32_t v = (uint32_t) token;
    for (int shift = 0; shift < 32; shift += 8) {
        state = fnv1a_byte(state, (uint8_t) (v >> shift));
    }
}

void llama_opt_hasher::feed(const llama_token * tokens, uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) {
        feed(tokens[i]);
    }
}

void llama_opt_hasher::feed_u64(uint64_t value) {
    for (int shift = 0; shift < 64; shift += 8) {
        state = fnv1a_byte(state, (uint8_t) (value >> shift));
    }
}

uint64_t llama_opt_hash_block(const llama_token * tokens, uint32_t n_tokens) {
    llama_opt_hasher h;
    h.feed(tokens, n_tokens);
    return h.finalize();
}

uint64_t llama_opt_hash_block_pos(const llama_token * tokens, uint32_t n_tokens, llama_pos pos_start) {
    llama_opt_hasher h;
    h.feed((llama_token) pos_start);
    h.feed(tokens, n_tokens);
    return h.finalize();
}

uint64_t llama_opt_hash_chain(uint64_t parent, const llama_token * tokens, uint32_t n_tokens) {
    llama_opt_hasher h;
    h.feed_u64(parent);
    h.feed(tokens, n_tokens);
    return h.finalize();
}

std::vector<llama_opt_block> llama_opt_segment(const llama_token * tokens, uint32_t n_tokens, uint32_t block_size) {
    if (block_size == 0) {
        throw llama_opt_error(llama_opt_errc::invalid_argument, "block_size must be at least 1", "block_size");
    }
    std::vector<llama_opt_block> blocks;
    blocks.reserve((n_tokens + block_size - 1) / block_size);
    uint64_t chain = LLAMA_OPT_CHAIN_ROOT;
    for (uint32_t start = 0; start < n_tokens; start += block_size) {
        const uint32_t n = std::min(block_size, n_tokens - start);
        chain = llama_opt_hash_chain(chain, tokens + start, n);
        blocks.push_back({ start, n, llama_opt_hash_block(tokens + start, n), chain });
    }
    return blocks;
}
