#pragma once

// kv/block-hash: FNV-1a 64-bit hashing of token blocks, the identity that block dedup,
// diffing and persistence build on. Tokens are hashed as raw 32-bit little-endian values,
// so results are the same on every platform.

#include "base/types.h"

#include <cstdint>
#include <vector>

constexpr uint64_t LLAMA_OPT_FNV_OFFSET = 0xcbf29ce484222325ULL;
constexpr uint64_t LLAMA_OPT_FNV_PRIME  = 0x100000001b3ULL;

// Position-independent hash of a block of tokens.
uint64_t llama_opt_hash_block(const llama_token * tokens, uint32_t n_tokens);

// Position-dependent hash: the block's absolute start position is hashed first.
uint64_t llama_opt_hash_block_pos(const llama_token * tokens, uint32_t n_tokens, llama_pos pos_start);

// Chained hash: names a block together with everything before it (hash of the parent
// block's chained hash, then the block's tokens), so equal ids mean equal prefixes.
// The first block's parent is LLAMA_OPT_CHAIN_ROOT.
constexpr uint64_t LLAMA_OPT_CHAIN_ROOT = 0;
uint64_t llama_opt_hash_chain(uint64_t parent, const llama_token * tokens, uint32_t n_tokens);

struct llama_opt_hasher {
    uint64_t state = LLAMA_OPT_FNV_OFFSET;

    void     feed(llama_token token);
    void     feed(const llama_token * tokens, uint32_t n);
    void     feed_u64(uint64_t value);  // 8 bytes, little-endian
    uint64_t finalize() const { return state; }
    void     reset() { state = LLAMA_OPT_FNV_OFFSET; }
};

struct llama_opt_block {
    uint32_t start;     // index of the first token
    uint32_t n_tokens;  // block_size, or less for the final partial block
    uint64_t hash;      // llama_opt_hash_block of the block's tokens
    uint64_t chain;     // llama_opt_hash_chain over all blocks up to and including this one
};

// Splits a context into blocks of block_size tokens; the final partial block is hashed with
// its real size. Every token belongs to exactly one block.
std::vector<llama_opt_block> llama_opt_segment(const llama_token * tokens, uint32_t n_tokens, uint32_t block_size);
