#include "kv/block-pool.h"

#include <algorithm>

llama_opt_block_pool::llama_opt_block_pool(uint32_t max_blocks) : max_blocks_(max_blocks) {
    if (max_blocks == 0) {
        throw llama_opt_error(llama_opt_errc::invalid_argument, "dedup_pool_max must be at least 1", "dedup_pool_max");
    }
}

const llama_opt_kv_block * llama_opt_block_pool::lookup(uint64_t hash, uint64_t parent, const llama_token * tokens,
                                                        uint32_t n_tokens) const {
    const auto range = by_hash_.equal_range(hash);
    for (auto it = range.first; it != range.second; ++it) {
        const llama_opt_kv_block & b = blocks_.at(it->second);
        if (b.parent == parent && b.tokens.size() == n_tokens && std::equal(tokens, tokens + n_tokens, b.tokens.begin())) {
            return &b;
        }
    }
    return nullptr;
}

const llama_opt_kv_block * llama_opt_block_pool::insert(uint64_t hash, uint64_t parent, uint32_t index,
                                                        const llama_token * tokens, uint32_t n_tokens) {
    if (const llama_opt_kv_block * found = lookup(hash, parent, tokens, n_tokens)) {
        return found;
    }
    if (blocks_.size() >= max_blocks_) {
        return nullptr;
    }
    const uint64_t id = next_id_++;
    llama_opt_kv_block & b = blocks_[id];
    b = { id, hash, parent, index, std::vector<llama_token>(tokens, tokens + n_tokens), {}, turn_ };
    by_hash_.emplace(hash, id);
    return &b;
}

void llama_opt_block_pool::ref(const llama_opt_kv_block * block, int32_t seq) {
    llama_opt_kv_block & b = blocks_.at(block->id);
    if (std::find(b.holders.begin(), b.holders.end(), seq) == b.holders.end()) {
        b.holders.push_back(seq);
    }
    b.last_access = turn_;
}

void llama_opt_block_pool::unref(const llama_opt_kv_block * block, int32_t seq) {
    const uint64_t id = block->id;
    llama_opt_kv_block & b = blocks_.at(id);
    b.holders.erase(std::remove(b.holders.begin(), b.holders.end(), seq), b.holders.end());
    if (b.holders.empty()) {
        const auto range = by_hash_.equal_range(b.hash);
        for (auto it = range.first; it != range.second; ++it) {
            if (it->second == id) {
                by_hash_.erase(it);
                break;
            }
        }
        blocks_.erase(id);
    }
}

const llama_opt_kv_block * llama_opt_block_pool::find(uint64_t id) const {
    const auto it = blocks_.find(id);
    return it == blocks_.end() ? nullptr : &it->second;
}

std::vector<uint64_t> llama_opt_block_pool::hashes() const {
    std::vector<uint64_t> out;
    out.reserve(blocks_.size());
    for (const auto & kv : blocks_) {
        out.push_back(kv.second.hash);
    }
    return out;
}
