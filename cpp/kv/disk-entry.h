#pragma once

// kv/disk-entry: one entry of the disk tier, a file holding the KV rows of a
// context's complete blocks, position-major, so that any block-aligned prefix of it can be
// restored. The format is in docs/persist-format.md: a fixed header naming the model, the build
// and the row layout, the token ids, the chained block hashes, a checksum per block, then the
// rows. An entry of version 2 extends a parent entry: it holds the rows (and checksums) of its
// blocks [base_blocks, n) only; the parent, named by the chained hash of block base_blocks - 1,
// holds the others (kv/disk-store follows it). Headers and every block carry checksums: a bad entry is a miss, never
// wrong KV.

#include "base/types.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

// What has to match, besides the tokens, for stored KV to be valid here.
struct llama_opt_persist_layout {
    uint64_t model_hash      = 0;
    uint64_t compat_hash     = 0;
    uint32_t block_size      = 0;
    uint32_t n_layers        = 0;
    uint32_t n_kv_heads      = 0;
    uint32_t k_dim           = 0;  // per head
    uint32_t v_dim           = 0;
    int32_t  k_type          = 0;  // ggml types
    int32_t  v_type          = 0;
    uint64_t bytes_per_token = 0;  // KV rows of one position, all layers

    uint64_t block_bytes() const { return (uint64_t) block_size * bytes_per_token; }

    bool operator==(const llama_opt_persist_layout & o) const;
    bool operator!=(const llama_opt_persist_layout & o) const { return !(*this == o); }
};

// One stored context, as its header says.
struct llama_opt_persist_entry {
    std::string              path;
    llama_opt_persist_layout layout;
    uint64_t                 context_hash = 0;  // chained hash of the last block
    uint32_t                 n_tokens     = 0;  // a multiple of block_size
    uint32_t                 base_blocks  = 0;  // blocks held by the parent entry (0: none, version 1)
    uint64_t                 file_size    = 0;
    int64_t                  mtime        = 0;  // seconds; refreshed on every load (LRU)
    int64_t                  mtime_ns     = 0;  // the same in nanoseconds: the LRU order
    std::vector<uint64_t>    chain;             // chained hash of each block
    std::vector<uint64_t>    checksums;         // of each own block's rows: blocks [base_blocks, n)
    uint64_t                 data_offset  = 0;
    std::string              problem;           // empty if the header is sound
};

// The file name of the entry whose last block has this chained hash.
std::string llama_opt_persist_entry_name(const llama_opt_persist_layout & layout, uint64_t context_hash);
// Whether a file name ends as entries' names do.
bool llama_opt_persist_has_entry_suffix(const std::string & name);

// The size of the file of an entry of n_blocks blocks, whose first base_blocks its parent holds.
uint64_t llama_opt_persist_file_size(const llama_opt_persist_layout & layout, uint64_t n_blocks, uint64_t base_blocks = 0);

// Writes n_bytes from src at offset of a file; false on an error.
using llama_opt_persist_writer = std::function<bool(const void * src, uint64_t n_bytes, uint64_t offset)>;

// Writes an entry of chain.size() blocks (tokens: chain.size() * block_size token ids, rows:
// their KV rows); false as soon as a write fails.
bool llama_opt_persist_write_entry(const llama_opt_persist_layout & layout, const std::vector<llama_token> & tokens,
                                   const std::vector<uint64_t> & chain, const uint8_t * rows,
                                   const llama_opt_persist_writer & write);

// The checksum of each of the n_blocks blocks of `rows` (position-major), as an entry stores them.
std::vector<uint64_t> llama_opt_persist_block_checksums(const llama_opt_persist_layout & layout, const uint8_t * rows,
                                                        uint64_t n_blocks);
// Writes an entry's header and tables (`sums`: the checksum of each own block's rows, the last
// sums.size() blocks: fewer than chain.size() make an extension of its parent; the caller writes
// them at the returned offset, own block j at data_offset + j * block_bytes); 0 if a write failed.
uint64_t llama_opt_persist_write_meta(const llama_opt_persist_layout & layout, const std::vector<llama_token> & tokens,
                                      const std::vector<uint64_t> & chain, const std::vector<uint64_t> & sums,
                                      const llama_opt_persist_writer & write);

// Reads an entry's header and tables (and its token ids, if `tokens`), checking their checksum;
// false, with entry.problem saying why, if the file is not a sound entry. Never follows a link.
bool llama_opt_persist_read_header(const std::string & path, llama_opt_persist_entry & entry,
                                   std::vector<llama_token> * tokens);

// Reads block k (one of its own: k >= base_blocks) of an entry open as fd into dst (layout.block_bytes()) and checks its checksum;
// empty if it is sound, else what is wrong with it.
std::string llama_opt_persist_read_block(int fd, const llama_opt_persist_entry & entry, uint64_t k, uint8_t * dst);
