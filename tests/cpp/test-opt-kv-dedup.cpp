// kv-cache-dedup block pool: verified lookups (collisions are misses), chains, holders,
// capacity, LRU.

#include "check.h"
#include "kv/block-hash.h"
#include "kv/block-pool.h"

#include <vector>

using tokens_t = std::vector<llama_token>;

static const llama_opt_kv_block * add(llama_opt_block_pool & pool, uint64_t hash, uint64_t parent, uint32_t index,
                                      const tokens_t & t, int32_t seq) {
    const llama_opt_kv_block * b = pool.insert(hash, parent, index, t.data(), (uint32_t) t.size());
    if (b) {
        pool.ref(b, seq);
    }
    return b;
}

static void test_lookup_verifies_tokens_and_parent() {
    llama_opt_block_pool pool(16);
    const tokens_t a = { 1, 2, 3, 4 }, b = { 5, 6, 7, 8 };
    const auto * root = add(pool, llama_opt_hash_chain(0, a.data(), 4), 0, 0, a, 0);
    const uint64_t hb = llama_opt_hash_chain(root->hash, b.data(), 4);
    const auto * child = add(pool, hb, root->id, 1, b, 0);
    CHECK(pool.size() == 2);
    CHECK(pool.lookup(hb, root->id, b.data(), 4) == child);
    CHECK(pool.lookup(hb, root->id + 100, b.data(), 4) == nullptr);  // other prefix
    const tokens_t c = { 5, 6, 7, 9 };
    CHECK(pool.lookup(hb, root->id, c.data(), 4) == nullptr);        // other tokens
    CHECK(pool.insert(hb, root->id, 1, b.data(), 4) == child);       // inserting again finds it
}

static void test_forced_collisions_are_misses() {
    // every block gets the same hash: verification alone must keep them apart
    llama_opt_block_pool pool(64);
    std::vector<const llama_opt_kv_block *> blocks;
    for (llama_token t = 0; t < 20; ++t) {
        const tokens_t tok = { t, t + 1 };
        blocks.push_back(add(pool, 42, 0, 0, tok, 0));
    }
    CHECK(pool.size() == 20);
    for (llama_token t = 0; t < 20; ++t) {
        const tokens_t tok = { t, t + 1 };
        CHECK(pool.lookup(42, 0, tok.data(), 2) == blocks[t]);
    }
    const tokens_t absent = { 100, 101 };
    CHECK(pool.lookup(42, 0, absent.data(), 2) == nullptr);
}

static void test_holders_and_removal() {
    llama_opt_block_pool pool(4);
    const tokens_t a = { 1, 2 };
    const auto * blk = add(pool, 7, 0, 0, a, 0);
    pool.ref(blk, 3);
    pool.ref(blk, 3);  // idempotent
    CHECK(blk->holders.size() == 2);
    const uint64_t id = blk->id;
    pool.unref(blk, 0);
    CHECK(pool.find(id) != nullptr);
    pool.unref(pool.find(id), 3);
    CHECK(pool.find(id) == nullptr && pool.size() == 0);  // nobody holds its KV: gone
    CHECK(pool.lookup(7, 0, a.data(), 2) == nullptr);
}

static void test_capacity_and_lru() {
    llama_opt_block_pool pool(3);
    std::vector<const llama_opt_kv_block *> b;
    for (llama_token t = 0; t < 3; ++t) {
        pool.next_turn();
        const tokens_t tok = { t };
        b.push_back(add(pool, (uint64_t) t, 0, 0, tok, 0));
    }
    const tokens_t extra = { 99 };
    CHECK(pool.insert(99, 0, 0, extra.data(), 1) == nullptr);  // full
    CHECK(pool.capacity() == 3);
    pool.next_turn();
    pool.ref(b[0], 0);  // touched: now the most recent
    CHECK(pool.least_recent([](const llama_opt_kv_block &) { return true; }) == b[1]);
    CHECK(pool.least_recent([&](const llama_opt_kv_block & x) { return &x != b[1]; }) == b[2]);
    CHECK_THROWS(llama_opt_block_pool(0), llama_opt_errc::invalid_argument);
}

int main() {
    test_lookup_verifies_tokens_and_parent();
    test_forced_collisions_are_misses();
    test_holders_and_removal();
    test_capacity_and_lru();
    return check_result("test-opt-kv-dedup");
}
