// Fuzzing at volume (spec 000 §6.4) of context-hash and kv-cache-diff against references written
// here, independently of the code under test:
//
//   fuzz-hash-diff [cases] [seed]      (default: 10000 cases, seed 1)
//
// hash: FNV-1a over the tokens' little-endian bytes, byte by byte, for hash_block, hash_block_pos,
// hash_chain, the incremental hasher (random cuts) and segment (coverage, sizes, chained hashes).
// diff: the spans tile both histories in order and rebuild the new one; KEEP spans hold equal
// tokens and, after the common prefix, are at least min_unchanged long; the common prefix the
// diff reports is the true one (the only span reused exactly); never more kept than the longest
// common subsequence (dynamic programming, for histories up to 64 tokens); one edit keeps all the
// rest (optimal); several edits lose at most two blocks around each, as in tests/test_diff.py.
// CTest runs a small seeded run; tools/fuzz.sh runs the million cases.

#include "check.h"
#include "kv/block-hash.h"
#include "kv/history-diff.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>
#include <vector>

using tokens_t = std::vector<llama_token>;

static uint64_t ref_fnv1a(const std::vector<uint8_t> & bytes, uint64_t state = 0xcbf29ce484222325ULL) {
    for (uint8_t b : bytes) {
        state = (state ^ b) * 0x100000001b3ULL;
    }
    return state;
}

static void put_le(std::vector<uint8_t> & out, uint64_t v, int n_bytes) {
    for (int i = 0; i < n_bytes; ++i) {
        out.push_back((uint8_t) (v >> (8 * i)));
    }
}

static std::vector<uint8_t> le_bytes(const tokens_t & t) {
    std::vector<uint8_t> out;
    for (llama_token x : t) {
        put_le(out, (uint32_t) x, 4);
    }
    return out;
}

static tokens_t random_tokens(std::mt19937_64 & rng, size_t n, uint32_t alphabet) {
    tokens_t t(n);
    for (auto & x : t) {
        x = alphabet ? (llama_token) (rng() % alphabet) : (llama_token) (uint32_t) rng();  // 0: any 32-bit value
    }
    return t;
}

static void fuzz_hash(std::mt19937_64 & rng) {
    const size_t n = rng() % 301;
    const tokens_t t = random_tokens(rng, n, rng() % 2 ? 0 : 300000);
    const std::vector<uint8_t> bytes = le_bytes(t);
    CHECK(llama_opt_hash_block(t.data(), (uint32_t) n) == ref_fnv1a(bytes));

    const llama_pos pos = (llama_pos) (uint32_t) rng();
    std::vector<uint8_t> with_pos;
    put_le(with_pos, (uint32_t) pos, 4);
    with_pos.insert(with_pos.end(), bytes.begin(), bytes.end());
    CHECK(llama_opt_hash_block_pos(t.data(), (uint32_t) n, pos) == ref_fnv1a(with_pos));

    const uint64_t parent = rng();
    std::vector<uint8_t> chained;
    put_le(chained, parent, 8);
    chained.insert(chained.end(), bytes.begin(), bytes.end());
    CHECK(llama_opt_hash_chain(parent, t.data(), (uint32_t) n) == ref_fnv1a(chained));

    llama_opt_hasher h;  // fed in random pieces
    for (size_t done = 0; done < n;) {
        const size_t piece = std::min(n - done, (size_t) (rng() % 40));
        if (piece == 1 && rng() % 2) {
            h.feed(t[done]);
        } else {
            h.feed(t.data() + done, (uint32_t) piece);
        }
        done += piece;
    }
    CHECK(h.finalize() == ref_fnv1a(bytes));

    const uint32_t block_size = 1 + (uint32_t) (rng() % 100);
    uint32_t next = 0;
    uint64_t chain = LLAMA_OPT_CHAIN_ROOT;
    for (const llama_opt_block & b : llama_opt_segment(t.data(), (uint32_t) n, block_size)) {
        const tokens_t block(t.begin() + b.start, t.begin() + b.start + b.n_tokens);
        std::vector<uint8_t> c;
        put_le(c, chain, 8);
        const std::vector<uint8_t> block_bytes = le_bytes(block);
        c.insert(c.end(), block_bytes.begin(), block_bytes.end());
        chain = ref_fnv1a(c);
        CHECK(b.start == next && b.n_tokens > 0 && (b.n_tokens == block_size || b.start + b.n_tokens == n));
        CHECK(b.hash == ref_fnv1a(block_bytes) && b.chain == chain);
        next = b.start + b.n_tokens;
    }
    CHECK(next == n);
}

// Checks the spans against both histories; returns the tokens kept.
static uint32_t check_spans(const tokens_t & prev, const tokens_t & curr, const llama_opt_diff_result & d,
                            uint32_t min_unchanged) {
    tokens_t out;
    uint32_t p = 0, c = 0, kept = 0;
    for (const auto & s : d) {
        CHECK(s.prev_start == p && s.curr_start == c);
        CHECK(s.prev_start + s.prev_length <= prev.size() && s.curr_start + s.curr_length <= curr.size());
        if (s.prev_start != p || s.curr_start != c || s.prev_start + s.prev_length > prev.size() ||
            s.curr_start + s.curr_length > curr.size()) {
            return kept;  // the rest would read out of bounds
        }
        switch (s.op) {
            case DIFF_KEEP:
                CHECK(s.prev_length == s.curr_length && s.prev_length > 0);
                CHECK(std::equal(prev.begin() + p, prev.begin() + p + s.prev_length, curr.begin() + c));
                CHECK(p == 0 || s.prev_length >= min_unchanged);
                out.insert(out.end(), prev.begin() + p, prev.begin() + p + s.prev_length);
                kept += s.prev_length;
                break;
            case DIFF_INSERT:  CHECK(s.prev_length == 0 && s.curr_length > 0); break;
            case DIFF_DELETE:  CHECK(s.prev_length > 0 && s.curr_length == 0); break;
            case DIFF_REPLACE: CHECK(s.prev_length > 0 && s.curr_length > 0); break;
        }
        if (s.op != DIFF_KEEP) {
            out.insert(out.end(), curr.begin() + c, curr.begin() + c + s.curr_length);
        }
        p += s.prev_length;
        c += s.curr_length;
    }
    CHECK(p == prev.size() && c == curr.size() && out == curr);
    uint32_t prefix = 0;
    while (prefix < prev.size() && prefix < curr.size() && prev[prefix] == curr[prefix]) {
        ++prefix;
    }
    CHECK(llama_opt_diff_common_prefix(d) == prefix);
    CHECK(llama_opt_diff_kept(d) == kept);
    return kept;
}

static uint32_t lcs(const tokens_t & a, const tokens_t & b) {
    std::vector<uint32_t> row(b.size() + 1, 0), next(b.size() + 1, 0);
    for (size_t i = 0; i < a.size(); ++i) {
        for (size_t j = 0; j < b.size(); ++j) {
            next[j + 1] = a[i] == b[j] ? row[j] + 1 : std::max(row[j + 1], next[j]);
        }
        std::swap(row, next);
    }
    return row[b.size()];
}

// An edit at a random place: curr = curr[:at] + inserted + curr[at + removed:], the inserted
// tokens offset by first_token; `untouched` follows which tokens of curr are prev's, unedited.
static void edit(std::mt19937_64 & rng, tokens_t & curr, std::vector<bool> & untouched, uint32_t max_len,
                 uint32_t first_token, uint32_t alphabet) {
    const size_t at      = rng() % (curr.size() + 1);
    const size_t removed = std::min<size_t>(curr.size() - at, rng() % (max_len + 1));
    const tokens_t inserted = random_tokens(rng, rng() % (max_len + 1), alphabet);
    curr.erase(curr.begin() + at, curr.begin() + at + removed);
    untouched.erase(untouched.begin() + at, untouched.begin() + at + removed);
    curr.insert(curr.begin() + at, inserted.begin(), inserted.end());
    untouched.insert(untouched.begin() + at, inserted.size(), false);
    for (size_t i = at; i < at + inserted.size(); ++i) {
        curr[i] += (llama_token) first_token;
    }
}

static uint64_t g_worst_work_per_token = 0;

static void fuzz_diff(std::mt19937_64 & rng) {
    const uint32_t kind = rng() % 4;
    if (kind == 0) {  // unrelated or loosely related histories on a small alphabet
        const uint32_t max_n = rng() % 2 ? 64 : 400;
        const uint32_t alphabet = 1 + rng() % 40;
        const tokens_t prev = random_tokens(rng, rng() % (max_n + 1), alphabet);
        tokens_t curr = rng() % 2 ? prev : random_tokens(rng, rng() % (max_n + 1), alphabet);
        std::vector<bool> untouched(curr.size(), true);
        for (uint32_t e = rng() % 4; e > 0; --e) {
            edit(rng, curr, untouched, 30, 0, alphabet);
        }
        const uint32_t block_size = 1 + rng() % 16, min_unchanged = 1 + rng() % 16;
        const llama_opt_diff_engine engine(block_size, min_unchanged);
        const llama_opt_diff_result d = engine.compute(prev.data(), (uint32_t) prev.size(), curr.data(), (uint32_t) curr.size());
        const uint32_t kept = check_spans(prev, curr, d, min_unchanged);
        if (prev.size() <= 64 && curr.size() <= 64) {
            CHECK(kept <= lcs(prev, curr));
        }
        const uint64_t total = prev.size() + curr.size();
        g_worst_work_per_token = std::max(g_worst_work_per_token, total ? engine.last_work() / total : 0);
    } else if (kind == 1) {  // one edit whose new tokens never equal old ones: everything else kept
        const tokens_t prev = random_tokens(rng, rng() % 401, 41);
        tokens_t curr = prev;
        std::vector<bool> untouched(curr.size(), true);
        edit(rng, curr, untouched, 30, 100, 41);
        const llama_opt_diff_engine engine(1 + rng() % 16);
        const uint32_t kept = check_spans(prev, curr, engine.compute(prev.data(), (uint32_t) prev.size(), curr.data(), (uint32_t) curr.size()), 1);
        CHECK(kept == (uint32_t) std::count(untouched.begin(), untouched.end(), true));
    } else if (kind == 2) {  // several edits on a large alphabet: at most two blocks lost around each
        const tokens_t prev = random_tokens(rng, 200 + rng() % 1801, 1000000);
        tokens_t curr = prev;
        std::vector<bool> untouched(curr.size(), true);
        const uint32_t n_edits = 1 + rng() % 4;
        for (uint32_t e = 0; e < n_edits; ++e) {
            edit(rng, curr, untouched, 20, 0, 1000000);
        }
        const uint32_t block_size = 16;
        const llama_opt_diff_engine engine(block_size);
        const uint32_t kept = check_spans(prev, curr, engine.compute(prev.data(), (uint32_t) prev.size(), curr.data(), (uint32_t) curr.size()), 1);
        const uint32_t n_untouched = (uint32_t) std::count(untouched.begin(), untouched.end(), true);
        CHECK(kept + n_edits * 2 * block_size >= n_untouched);
    } else {  // limits: empty, equal, one repeated token, block sizes larger than the histories
        const uint32_t n = rng() % 300;
        const tokens_t prev(n, (llama_token) (rng() % 3));
        tokens_t curr = rng() % 3 == 0 ? tokens_t() : prev;
        if (!curr.empty() && rng() % 2) {
            curr[rng() % curr.size()] = -1;
        }
        const uint32_t block_size = rng() % 2 ? 1 : 1 + (uint32_t) (rng() % 1000);
        const uint32_t min_unchanged = 1 + rng() % 70;
        const llama_opt_diff_engine engine(block_size, min_unchanged);
        check_spans(prev, curr, engine.compute(prev.data(), (uint32_t) prev.size(), curr.data(), (uint32_t) curr.size()), min_unchanged);
        check_spans(curr, prev, engine.compute(curr.data(), (uint32_t) curr.size(), prev.data(), (uint32_t) prev.size()), min_unchanged);
    }
}

int main(int argc, char ** argv) {
    const uint64_t cases = argc > 1 ? strtoull(argv[1], nullptr, 10) : 10000;
    const uint64_t seed  = argc > 2 ? strtoull(argv[2], nullptr, 10) : 1;
    std::mt19937_64 rng(seed);
    const auto start = std::chrono::steady_clock::now();
    for (uint64_t i = 0; i < cases && g_failures < 20; ++i) {
        const int before = g_failures;
        fuzz_hash(rng);
        fuzz_diff(rng);
        if (g_failures > before) {
            fprintf(stderr, "case %llu (seed %llu) failed\n", (unsigned long long) i, (unsigned long long) seed);
        }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    printf("fuzz-hash-diff: %llu hash cases and %llu diff cases, seed %llu, %.1f s, diff work per token at most %llu\n",
           (unsigned long long) cases, (unsigned long long) cases, (unsigned long long) seed, seconds,
           (unsigned long long) g_worst_work_per_token);
    return check_result("fuzz-hash-diff");
}
