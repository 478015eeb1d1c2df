#pragma once

// llama-kv-cache-persist: the disk tier of the KV store. One file per stored context holds the
// KV rows of its complete blocks, position-major, so that any block-aligned prefix of it can be
// restored (a new prompt sharing its first 6k tokens with a stored 8k context restores 6k).
// The format is in docs/persist-format.md. Plain C++17 and POSIX, no llama.cpp: the engine
// hands in rows it read with llama_memory_seq_kv_read (patches/0005).
//
// Safety: every entry names the model (a hash of its weights) and everything else that decides
// the KV bits (compat hash: llama.cpp pin and patches, CPU flags, attention settings, row
// layout); a mismatch is a miss, never wrong KV. Headers and every block carry checksums; a bad
// entry is removed and counted. Writes go to a temporary file that is fsynced and renamed, so
// readers (other processes included) never see half an entry; readers keep an open file
// readable while another process replaces or removes it (POSIX), so no locks are needed.

#include "llama-opt.h"

#include <cstdint>
#include <string>
#include <sys/stat.h>
#include <vector>

// Fast 64-bit checksum of bytes (word-wise multiply-rotate; any change of one 8-byte word
// changes the result). Not cryptographic: it guards against corruption, not attackers.
uint64_t llama_opt_checksum(const void * data, size_t n_bytes, uint64_t seed = 0);

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

    bool operator==(const llama_opt_persist_layout & o) const;
    bool operator!=(const llama_opt_persist_layout & o) const { return !(*this == o); }
};

// One stored context, as its header says.
struct llama_opt_persist_entry {
    std::string              path;
    llama_opt_persist_layout layout;
    uint64_t                 context_hash = 0;  // chained hash of the last block
    uint32_t                 n_tokens     = 0;  // a multiple of block_size
    uint64_t                 file_size    = 0;
    int64_t                  mtime        = 0;  // seconds; refreshed on every load (LRU)
    int64_t                  mtime_ns     = 0;  // the same in nanoseconds: the LRU order
    std::vector<uint64_t>    chain;             // chained hash of each block
    std::vector<uint64_t>    checksums;         // of each block's rows
    uint64_t                 data_offset  = 0;
    std::string              problem;           // empty if the header is sound
};

// Why a lookup or a load gave nothing.
// unsafe_dir: the directory became writable by others (or not ours, or not a directory) since it
// was checked: not read (a plain miss; the next save says why)
enum class llama_opt_persist_miss { none, not_stored, incompatible, corrupt, unsafe_dir };

class llama_opt_persist_store {
public:
    // The directory is created (0700) by the first save, which reports if it cannot be or if
    // llama_opt_persist_check_dir refuses it; entries are 0600.
    explicit llama_opt_persist_store(std::string dir);

    const std::string & dir() const { return dir_; }

    struct match {
        llama_opt_persist_entry entry;
        uint32_t                n_blocks = 0;  // blocks of `tokens` the entry holds
        llama_opt_persist_miss  miss     = llama_opt_persist_miss::not_stored;
    };
    // The entry holding the longest prefix of `tokens` (at most max_blocks blocks), verified
    // token by token. `chain` holds the chained hashes of the blocks of `tokens`. miss says
    // why nothing matched: not_stored, or incompatible when only entries for another model or
    // build hold these tokens.
    match find(const llama_opt_persist_layout & layout, const std::vector<uint64_t> & chain,
               const llama_token * tokens, size_t max_blocks) const;

    // Reads the rows of blocks [first, last) of an entry into dst (block_size * bytes_per_token
    // per block), checking each block's checksum. Returns the number of blocks read; fewer
    // means the rest was gone (miss = not_stored: another process removed the entry) or
    // unreadable or corrupt (miss = corrupt: the entry is removed); `why` says what happened.
    uint32_t load(const llama_opt_persist_entry & entry, uint32_t first, uint32_t last, uint8_t * dst,
                  std::string & why, llama_opt_persist_miss & miss) const;

    // Stores a context: n_tokens = chain.size() * block_size tokens and their rows, position-
    // major. Atomic; entries whose tokens are a prefix of this one are removed (this one
    // restores them too); with max_bytes > 0, least recently used other entries are removed
    // until the directory fits, and an entry larger than max_bytes is not stored. Returns false
    // (and why) on an I/O error or that: nothing is left behind.
    bool save(const llama_opt_persist_layout & layout, const std::vector<llama_token> & tokens,
              const std::vector<uint64_t> & chain, const uint8_t * rows, std::string & why,
              uint64_t max_bytes = 0) const;

    // Every entry (headers only; `problem` set for unreadable ones) and the total size.
    std::vector<llama_opt_persist_entry> list() const;
    // Reads a whole entry and checks every checksum; empty if it is sound.
    std::string verify(const std::string & path) const;
    // Removes entries older than max_age_s seconds (0: no age limit), then the least recently
    // used ones until the total is at most max_bytes (0: no limit), and temporary files of
    // interrupted saves older than an hour; never `keep`. Returns the number of files removed.
    size_t cleanup(int64_t max_age_s, uint64_t max_bytes, const std::string & keep = "") const;
    // Removes one entry; false if it was not there.
    bool remove(const std::string & path) const;
    // Marks an entry used now (its mtime: the order in which cleanup removes entries).
    void touch(const std::string & path) const;

    // Test hook: saves fail after writing this many bytes of their temporary file, as on a full
    // disk (0: off).
    void fail_after_bytes(uint64_t n) { fail_after_ = n; }

private:
    std::string dir_;
    uint64_t    fail_after_ = 0;

    bool read_header(const std::string & path, llama_opt_persist_entry & entry, std::vector<llama_token> * tokens) const;
};

// Checks that dir is a directory of this user's that no other user can write (a writer there
// can plant KV that passes every checksum: integrity is not authenticity), as OpenSSH does for
// key directories; one readable by others (0755, from older versions) is tightened to 0700.
// False, and why (with what to do), otherwise.
bool llama_opt_persist_check_dir(const std::string & dir, std::string & why);

// Creates dir (0700) if it is missing, then llama_opt_persist_check_dir.
bool llama_opt_persist_prepare_dir(const std::string & dir, std::string & why);

// The default directory: $XDG_CACHE_HOME/pyllamaopt/kv (an absolute one), else ~/.cache/pyllamaopt/kv
// ($HOME, else the account's home), else /tmp/pyllamaopt-<uid>/kv.
std::string llama_opt_persist_default_dir();

// The checksum of a file's whole content (the model's identity: its weights and metadata, not
// its name). Remembered in memo_dir/file-hashes by (path, device, inode, size, mtime, ctime), so that
// a large model is read once per version, not once per process. ctime is there because tools
// that copy a file may restore its mtime, but nothing can set ctime back; a file written just before
// it was read is not remembered (its times could stay the same through another write). `loaded`: the file as the
// model was loaded from it (its stat); a file at `path` that is no longer that one (replaced, or
// written since) throws, as its content would name KV computed with other weights. Throws
// std::runtime_error if the file cannot be read.
uint64_t llama_opt_file_hash(const std::string & path, const std::string & memo_dir, const struct stat & loaded);

// Whether two stats are of the same file in the same version (device, inode, size, mtime, ctime).
bool llama_opt_same_file_version(const struct stat & a, const struct stat & b);
