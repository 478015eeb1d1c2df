// context-hash: fixed vectors (computed independently, byte-wise FNV-1a over little-endian
// token values), incremental == one-shot, segmentation and chained hashes.

#include "check.h"
#include "kv/block-hash.h"

#include <random>
#include <vector>

static void test_fixed_vectors() {
    const std::vector<llama_token> none, zero = { 0 }, abc = { 1, 2, 3 }, neg = { -1 }, big = { 262143, 2, 105 };
    CHECK(llama_opt_hash_block(none.data(), 0) == 0xcbf29ce484222325ULL);
    CHECK(llama_opt_hash_block(zero.data(), 1) == 0x4d25767f9dce13f5ULL);
    CHECK(llama_opt_hash_block(abc.data(), 3) == 0xfd1f0f4381eb0395ULL);
    CHECK(llama_opt_hash_block(neg.data(), 1) == 0x994f76653e2a3951ULL);
    CHECK(llama_opt_hash_block(big.data(), 3) == 0xf852e099c19e061bULL);
    CHECK(llama_opt_hash_block_pos(abc.data(), 3, 7) == 0xf26e7ff7c2e57ca2ULL);
    CHECK(llama_opt_hash_chain(LLAMA_OPT_CHAIN_ROOT, abc.data(), 3) == 0x973d59669a25a835ULL);
}

static void test_incremental_equals_one_shot() {
    std::mt19937 rng(42);
    for (int trial = 0; trial < 200; ++trial) {
        std::vector<llama_token> t(rng() % 300);
        for (auto & x : t) {
            x = (llama_token) (rng() % 262144);
        }
        llama_opt_hasher h;
        size_t i = 0;
        while (i < t.size()) {  // feed in random pieces, single tokens included
            const size_t n = std::min<size_t>(t.size() - i, rng() % 7);
            if (n == 1) {
                h.feed(t[i]);
            } else {
                h.feed(t.data() + i, (uint32_t) n);
            }
            i += n;
        }
        CHECK(h.finalize() == llama_opt_hash_block(t.data(), (uint32_t) t.size()));
        h.reset();
        CHECK(h.finalize() == LLAMA_OPT_FNV_OFFSET);
    }
}

static void test_position_dependence() {
    const std::vector<llama_token> t = { 5, 6, 7, 8 };
    CHECK(llama_opt_hash_block_pos(t.data(), 4, 0) != llama_opt_hash_block_pos(t.data(), 4, 64));
    CHECK(llama_opt_hash_block_pos(t.data(), 4, 64) == llama_opt_hash_block_pos(t.data(), 4, 64));
}

static void test_segmentation() {
    std::vector<llama_token> t(150);
    for (size_t i = 0; i < t.size(); ++i) {
        t[i] = (llama_token) (i * 7 % 1000);
    }
    const auto blocks = llama_opt_segment(t.data(), (uint32_t) t.size(), 64);
    CHECK(blocks.size() == 3);
    CHECK(blocks[0].start == 0 && blocks[0].n_tokens == 64);
    CHECK(blocks[1].start == 64 && blocks[1].n_tokens == 64);
    CHECK(blocks[2].start == 128 && blocks[2].n_tokens == 22);  // final partial block, real size
    CHECK(blocks[2].hash == llama_opt_hash_block(t.data() + 128, 22));
    CHECK(blocks[0].chain == llama_opt_hash_chain(LLAMA_OPT_CHAIN_ROOT, t.data(), 64));
    CHECK(blocks[1].chain == llama_opt_hash_chain(blocks[0].chain, t.data() + 64, 64));

    // same block tokens after a different prefix: same block hash, different chained hash
    std::vector<llama_token> u = t;
    u[3] += 1;
    const auto other = llama_opt_segment(u.data(), (uint32_t) u.size(), 64);
    CHECK(other[1].hash == blocks[1].hash);
    CHECK(other[1].chain != blocks[1].chain);

    CHECK(llama_opt_segment(t.data(), 0, 64).empty());
    CHECK_THROWS(llama_opt_segment(t.data(), 10, 0), llama_opt_errc::invalid_argument);
}

int main() {
    test_fixed_vectors();
    test_incremental_equals_one_shot();
    test_position_dependence();
    test_segmentation();
    return check_result("test-opt-context-hash");
}
