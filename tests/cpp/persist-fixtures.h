#pragma once

// The disk tier's unit tests' fixtures: a small row layout, contexts of made-up tokens, chained
// hashes and rows (some sharing a prefix), fresh directories removed at the end.

#include "kv/block-hash.h"
#include "kv/disk-entry.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include <unistd.h>

static const uint32_t B = 4;

static llama_opt_persist_layout layout(uint64_t model = 7) {
    llama_opt_persist_layout l;
    l.model_hash = model;
    l.compat_hash = 11;
    l.block_size = B;
    l.n_layers = 2;
    l.n_kv_heads = 1;
    l.k_dim = l.v_dim = 4;
    l.k_type = l.v_type = 1;
    l.bytes_per_token = 32;
    return l;
}

struct context {
    std::vector<llama_token> tokens;
    std::vector<uint64_t>    chain;
    std::vector<uint8_t>     rows;
};

static context make(size_t n_blocks, int seed, size_t same_blocks = 0, const context * like = nullptr) {
    context c;
    for (size_t i = 0; i < n_blocks * B; ++i) {
        c.tokens.push_back(like && i < same_blocks * B ? like->tokens[i] : (llama_token) (seed * 1000 + i));
    }
    uint64_t h = LLAMA_OPT_CHAIN_ROOT;
    for (size_t k = 0; k < n_blocks; ++k) {
        h = llama_opt_hash_chain(h, c.tokens.data() + k * B, B);
        c.chain.push_back(h);
    }
    for (size_t i = 0; i < n_blocks * B * 32; ++i) {
        c.rows.push_back(like && i < same_blocks * B * 32 ? like->rows[i] : (uint8_t) (seed * 31 + i * 7));
    }
    return c;
}

static std::vector<std::string> made_dirs;  // removed by remove_made_dirs()

static std::string fresh_dir(const char * name) {
    char tmpl[] = "/tmp/llama-opt-persist-XXXXXX";
    made_dirs.emplace_back(mkdtemp(tmpl));
    return made_dirs.back() + "/" + name;
}

static void flip_byte(const std::string & path, long offset) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(offset);
    char c;
    f.get(c);
    f.seekp(offset);
    f.put((char) (c ^ 0x10));
}

static void remove_made_dirs() {
    for (const std::string & dir : made_dirs) {
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
    }
}
