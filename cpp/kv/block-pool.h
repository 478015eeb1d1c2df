#pragma once

// kv/block-pool: the pool of KV blocks present in a context, so that a session whose
// history starts with blocks another sequence already holds shares those KV cells instead of
// computing them.
//
// A block is named by its chained hash (parent's chained hash + its tokens), so a block names
// its whole prefix: K/V of a block depend on every token before it. Every hit is verified:
// same tokens, and the same parent block, so a hash collision is a miss, never wrong KV.

#include "base/types.h"

#include <unordered_map>
#include <vector>

struct llama_opt_kv_block {
    uint64_t                 id;           // unique in the pool, never reused
    uint64_t                 hash;         // chained hash
    uint64_t                 parent;       // id of the previous block (0 for a first block)
    uint32_t                 index;        // block number: positions [index * block_size, ...)
    std::vector<llama_token> tokens;       // for verification
    std::vector<int32_t>     holders;      // sequences whose KV cells hold this block
    uint64_t                 last_access;  // turn counter, for LRU
};

class llama_opt_block_pool {
public:
    explicit llama_opt_block_pool(uint32_t max_blocks);

    // The block with this chained hash, parent and tokens; nullptr on a miss or a collision.
    const llama_opt_kv_block * lookup(uint64_t hash, uint64_t parent, const llama_token * tokens, uint32_t n_tokens) const;

    // lookup(), or a new block if none matches; nullptr when the pool is full.
    const llama_opt_kv_block * insert(uint64_t hash, uint64_t parent, uint32_t index,
                                      const llama_token * tokens, uint32_t n_tokens);

    // `seq` holds / no longer holds the block's KV. A block nobody holds is removed:
    // its KV cells are gone.
    void ref(const llama_opt_kv_block * block, int32_t seq);
    void unref(const llama_opt_kv_block * block, int32_t seq);

    const llama_opt_kv_block * find(uint64_t id) const;

    // The least recently used block that `evictable` accepts, or nullptr.
    template <typename F>
    const llama_opt_kv_block * least_recent(F && evictable) const {
        const llama_opt_kv_block * best = nullptr;
        for (const auto & kv : blocks_) {
            if ((!best || kv.second.last_access < best->last_access) && evictable(kv.second)) {
                best = &kv.second;
            }
        }
        return best;
    }

    uint64_t next_turn() { return ++turn_; }
    uint64_t turn() const { return turn_; }
    uint32_t size() const { return (uint32_t) blocks_.size(); }
    // The chained hash of every block in the pool (each names a prefix whose KV is here).
    std::vector<uint64_t> hashes() const;
    uint32_t capacity() const { return max_blocks_; }

private:
    uint32_t                                     max_blocks_;
    uint64_t                                     turn_    = 0;
    uint64_t                                     next_id_ = 1;
    std::unordered_map<uint64_t, llama_opt_kv_block> blocks_;   // by id
    std::unordered_multimap<uint64_t, uint64_t>      by_hash_;  // chained hash -> id
};
