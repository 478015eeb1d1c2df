// Fuzzing at volume (spec 000 §6.4) of the persist reader: mutated entries, and the memo of
// file hashes, never crash the reader, never make it allocate more than the file justifies, and
// never make it accept a wrong row.
//
//   fuzz-persist [cases] [seed]      (default: 2000 cases, seed 1)
//
// Each case takes a sound entry (random layout: block sizes 1-8, 1-64 blocks) and mutates it:
// bit flips, bytes set to 0x00/0xff/0x7f/0x80, truncation or extension, shuffled token / chain /
// checksum tables, a header field set to a limit (0, 1, 2^31, 2^32-1, 2^64-1, off by one, doubled),
// or a header whose lengths agree with each other and whose 64-bit size arithmetic wraps around
// to the real file size. Table and header mutations are written with the header checksum
// recomputed half of the time, so that the checks behind it are reached. Then the reader lists,
// verifies, looks up the original tokens, loads what it found and cleans up. The oracle: no
// exception, no allocation over 64 MiB (operator new is replaced), every row loaded equal to the
// original row of its block, an entry that verify() calls sound loads completely and equal, and
// cleanup() removes every entry whose header is bad.
// CTest runs a small seeded run; tools/fuzz.sh runs 10^5 cases.

#include "check.h"
#include "kv/block-hash.h"
#include "kv/disk-store.h"
#include "base/checksum.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <new>
#include <random>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

// Allocations the reader makes: nothing in these entries justifies more than a few KiB.
static constexpr size_t ALLOC_LIMIT = 64u << 20;
static uint64_t         g_oversized = 0;

void * operator new(size_t n) {
    if (n > ALLOC_LIMIT) {
        ++g_oversized;
        throw std::bad_alloc();
    }
    if (void * p = malloc(n ? n : 1)) {
        return p;
    }
    throw std::bad_alloc();
}
void operator delete(void * p) noexcept { free(p); }
void operator delete(void * p, size_t) noexcept { free(p); }

using bytes_t = std::vector<uint8_t>;

struct original {
    llama_opt_persist_layout layout;
    std::vector<llama_token> tokens;
    std::vector<uint64_t>    chain;
    bytes_t                  rows;
    std::string              name;  // file name in the directory
    bytes_t                  file;  // the sound entry
};

// Where the header's fields are (docs/persist-format.md).
struct field { uint32_t offset, width; };
static const field FIELDS[] = { { 8, 4 },  { 12, 4 }, { 16, 8 }, { 24, 8 }, { 32, 8 }, { 40, 4 }, { 44, 4 },
                                { 48, 4 }, { 52, 4 }, { 56, 4 }, { 60, 4 }, { 64, 4 }, { 68, 4 }, { 72, 8 },
                                { 80, 8 }, { 88, 8 }, { 96, 8 }, { 104, 8 }, { 112, 8 }, { 120, 8 } };
enum : uint32_t { N_TOKENS = 40, BLOCK_SIZE = 44, BYTES_PER_TOKEN = 72, TOKENS_OFF = 80, CHAIN_OFF = 88,
                  CHECKSUMS_OFF = 96, DATA_OFF = 104, FILE_SIZE = 112, META = 120, HEADER = 128 };

static uint64_t get(const bytes_t & f, uint32_t offset, uint32_t width) {
    uint64_t v = 0;
    memcpy(&v, f.data() + offset, width);
    return v;
}

static void set(bytes_t & f, uint32_t offset, uint32_t width, uint64_t v) {
    memcpy(f.data() + offset, &v, width);
}

static bytes_t read_file(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    return bytes_t((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

static void write_file(const std::string & path, const bytes_t & b) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write((const char *) b.data(), (std::streamsize) b.size());
}

// The header checksum as the writer computes it, over the tables where the (mutated) header says
// they are; false if they are not inside the file.
static bool recompute_meta(bytes_t & f) {
    if (f.size() < HEADER) {
        return false;
    }
    const uint64_t n_tokens = get(f, N_TOKENS, 4), block_size = get(f, BLOCK_SIZE, 4);
    const uint64_t n_blocks = block_size ? n_tokens / block_size : 0;
    const uint64_t spans[3][2] = { { get(f, TOKENS_OFF, 8), 4 * n_tokens }, { get(f, CHAIN_OFF, 8), 8 * n_blocks },
                                   { get(f, CHECKSUMS_OFF, 8), 8 * n_blocks } };
    for (const auto & s : spans) {
        if (s[0] > f.size() || s[1] > f.size() - s[0]) {
            return false;
        }
    }
    set(f, META, 8, 0);
    uint64_t c = llama_opt_checksum(f.data(), HEADER);
    for (const auto & s : spans) {
        c = llama_opt_checksum(f.data() + s[0], s[1], c);
    }
    set(f, META, 8, c);
    return true;
}

static original make_original(std::mt19937_64 & rng, const std::string & dir) {
    original o;
    o.layout.model_hash = rng();
    o.layout.compat_hash = rng();
    o.layout.block_size = 1 + rng() % 8;
    o.layout.n_layers = 1 + rng() % 3;
    o.layout.n_kv_heads = 1 + rng() % 2;
    o.layout.k_dim = 1 + rng() % 8;
    o.layout.v_dim = 1 + rng() % 8;
    o.layout.k_type = o.layout.v_type = 1;
    o.layout.bytes_per_token = 2ull * o.layout.n_layers * o.layout.n_kv_heads * (o.layout.k_dim + o.layout.v_dim);
    const uint32_t n_blocks = rng() % 4 == 0 ? 64 : 1 + rng() % 6;
    for (uint32_t i = 0; i < n_blocks * o.layout.block_size; ++i) {
        o.tokens.push_back((llama_token) (rng() % 300000));
    }
    for (const llama_opt_block & b : llama_opt_segment(o.tokens.data(), (uint32_t) o.tokens.size(), o.layout.block_size)) {
        o.chain.push_back(b.chain);
    }
    o.rows.resize(o.tokens.size() * o.layout.bytes_per_token);
    for (auto & b : o.rows) {
        b = (uint8_t) rng();
    }
    llama_opt_persist_store store(dir);
    std::string why;
    if (!store.save(o.layout, o.tokens, o.chain, o.rows.data(), why)) {
        fprintf(stderr, "cannot save an entry in %s: %s\n", dir.c_str(), why.c_str());
        exit(2);
    }
    const auto entries = store.list();
    o.name = entries.at(0).path.substr(dir.size() + 1);
    o.file = read_file(entries[0].path);
    store.remove(entries[0].path);
    return o;
}

static uint64_t limit_value(std::mt19937_64 & rng, uint64_t orig) {
    const uint64_t values[] = { 0, 1, 2, 0x7fffffffull, 0x80000000ull, 0xffffffffull, 0xfffffffeull,
                                0x8000000000000000ull, ~0ull, ~0ull - 1, orig + 1, orig - 1, orig * 2, orig + 4096 };
    return values[rng() % (sizeof(values) / sizeof(values[0]))];
}

// Lengths that agree with each other, with bytes_per_token chosen so that
// data_offset + n_tokens * bytes_per_token wraps around to the file's real size.
static void wrapping_header(std::mt19937_64 & rng, bytes_t & f) {
    const uint64_t n_tokens = (uint64_t) (0x7fffffff - (rng() % 1000) * 2) | 1;  // odd, block size 1: invertible mod 2^64
    const uint64_t tokens_off = HEADER, chain_off = tokens_off + 4 * n_tokens, sums_off = chain_off + 8 * n_tokens;
    const uint64_t data_off = (sums_off + 8 * n_tokens + 4095) / 4096 * 4096;
    uint64_t inverse = n_tokens;  // Newton's iteration for the inverse of an odd number mod 2^64
    for (int i = 0; i < 6; ++i) {
        inverse *= 2 - n_tokens * inverse;
    }
    set(f, N_TOKENS, 4, n_tokens);
    set(f, BLOCK_SIZE, 4, 1);
    set(f, BYTES_PER_TOKEN, 8, ((uint64_t) f.size() - data_off) * inverse);
    set(f, TOKENS_OFF, 8, tokens_off);
    set(f, CHAIN_OFF, 8, chain_off);
    set(f, CHECKSUMS_OFF, 8, sums_off);
    set(f, DATA_OFF, 8, data_off);
    set(f, FILE_SIZE, 8, f.size());
}

static void shuffle_table(std::mt19937_64 & rng, bytes_t & f, const original & o) {
    const uint64_t n_blocks = o.chain.size();
    const uint32_t table = rng() % 3;
    const uint64_t offset = table == 0 ? HEADER : table == 1 ? get(o.file, CHAIN_OFF, 8) : get(o.file, CHECKSUMS_OFF, 8);
    const uint64_t width = table == 0 ? 4 : 8, count = table == 0 ? o.tokens.size() : n_blocks;
    std::vector<uint64_t> items(count);
    for (uint64_t i = 0; i < count; ++i) {
        items[i] = get(f, (uint32_t) (offset + i * width), (uint32_t) width);
    }
    if (rng() % 2) {
        std::shuffle(items.begin(), items.end(), rng);
    } else if (count > 1) {
        std::swap(items[rng() % count], items[rng() % count]);
    }
    for (uint64_t i = 0; i < count; ++i) {
        set(f, (uint32_t) (offset + i * width), (uint32_t) width, items[i]);
    }
}

static const char * mutate(std::mt19937_64 & rng, bytes_t & f, const original & o) {
    switch (rng() % 7) {
        case 0:
            for (uint32_t n = 1 + rng() % 8; n > 0; --n) {
                f[rng() % f.size()] ^= (uint8_t) (1u << (rng() % 8));
            }
            return "bit flips";
        case 1:
            for (uint32_t n = 1 + rng() % 4; n > 0; --n) {
                static const uint8_t values[] = { 0x00, 0xff, 0x7f, 0x80 };
                f[rng() % (rng() % 2 ? HEADER : f.size())] = values[rng() % 4];
            }
            return "bytes set";
        case 2:
            if (rng() % 4 == 0) {
                f.resize(f.size() + 1 + rng() % 8192, (uint8_t) rng());
                return "extended";
            }
            f.resize(rng() % f.size());
            return "truncated";
        case 3:
            shuffle_table(rng, f, o);
            if (rng() % 2) {
                recompute_meta(f);
            }
            return "shuffled table";
        case 4:
        case 5: {
            const field & fld = FIELDS[rng() % (sizeof(FIELDS) / sizeof(FIELDS[0]))];
            set(f, fld.offset, fld.width, limit_value(rng, get(f, fld.offset, fld.width)));
            if (rng() % 2) {
                recompute_meta(f);
            }
            return "header field at a limit";
        }
        default:
            wrapping_header(rng, f);
            return "wrapping lengths";
    }
}

static void check_entry(std::mt19937_64 & rng, const std::string & dir, const original & o, const char * what) {
    llama_opt_persist_store store(dir);
    const std::string path = dir + "/" + o.name;
    const auto entries = store.list();
    CHECK(entries.size() == 1);
    const bool header_ok = !entries.empty() && entries[0].problem.empty();
    const std::string problem = store.verify(path);
    const uint32_t n_blocks = (uint32_t) o.chain.size();
    const auto m = store.find(o.layout, o.chain, o.tokens.data(), n_blocks);
    CHECK(m.n_blocks <= n_blocks);
    if (m.n_blocks > 0) {
        const uint32_t first = (uint32_t) (rng() % m.n_blocks);
        const uint64_t block_bytes = (uint64_t) o.layout.block_size * o.layout.bytes_per_token;
        bytes_t rows((m.n_blocks - first) * block_bytes);
        std::string why;
        llama_opt_persist_miss miss;
        const uint32_t k = store.load(m.entry, first, m.n_blocks, rows.data(), why, miss);
        CHECK(k <= m.n_blocks - first);
        if (!std::equal(rows.begin(), rows.begin() + k * block_bytes, o.rows.begin() + first * block_bytes)) {
            fprintf(stderr, "%s: a wrong row was accepted\n", what);
            CHECK(false);
        }
        if (problem.empty()) {
            CHECK(k == m.n_blocks - first);  // sound entries load completely
        }
    }
    if (problem.empty() && m.n_blocks == n_blocks) {
        bytes_t rows(o.rows.size());
        std::string why;
        llama_opt_persist_miss miss;
        CHECK(store.load(m.entry, 0, n_blocks, rows.data(), why, miss) == n_blocks && rows == o.rows);
    }
    store.cleanup(0, 0);
    if (!header_ok) {
        CHECK(store.list().empty());  // a bad header is removed by cleanup
    }
}

int main(int argc, char ** argv) {
    const uint64_t cases = argc > 1 ? strtoull(argv[1], nullptr, 10) : 2000;
    const uint64_t seed  = argc > 2 ? strtoull(argv[2], nullptr, 10) : 1;
    std::mt19937_64 rng(seed);
    const char * tmp = getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/llama-opt-fuzz-persist-XXXXXX";
    if (!mkdtemp(&tmpl[0])) {
        perror("mkdtemp");
        return 2;
    }
    const std::string dir = tmpl + "/kv";
    std::vector<original> originals;
    for (int i = 0; i < 16; ++i) {
        originals.push_back(make_original(rng, dir));
    }
    std::map<std::string, uint64_t> kinds;
    const auto start = std::chrono::steady_clock::now();
    for (uint64_t i = 0; i < cases && g_failures < 20; ++i) {
        const original & o = originals[rng() % originals.size()];
        bytes_t f = o.file;
        const char * what = mutate(rng, f, o);
        ++kinds[what];
        write_file(dir + "/" + o.name, f);
        const int before = g_failures;
        try {
            check_entry(rng, dir, o, what);
        } catch (const std::exception & e) {
            fprintf(stderr, "%s: exception %s\n", what, e.what());
            CHECK(false);
        }
        if (g_failures > before) {
            fprintf(stderr, "case %llu (seed %llu, %s) failed\n", (unsigned long long) i, (unsigned long long) seed, what);
        }
        unlink((dir + "/" + o.name).c_str());
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    printf("fuzz-persist: %llu mutated entries, seed %llu, %.1f s, oversized allocations refused %llu;",
           (unsigned long long) cases, (unsigned long long) seed, seconds, (unsigned long long) g_oversized);
    for (const auto & k : kinds) {
        printf(" %s %llu,", k.first.c_str(), (unsigned long long) k.second);
    }
    printf("\n");
    CHECK(g_oversized == 0);
    rmdir(dir.c_str());
    rmdir(tmpl.c_str());
    return check_result("fuzz-persist");
}
