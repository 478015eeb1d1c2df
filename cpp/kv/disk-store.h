#pragma once

// kv/disk-store: the disk tier of the KV store, a directory of entries
// (kv/disk-entry), one per stored context, so that a new prompt sharing its first
// 6k tokens with a stored 8k context restores 6k. Lookups by longest prefix, LRU removal within
// a size budget. Plain C++17 and POSIX, no llama.cpp: the engine hands in rows it read with
// llama_memory_seq_kv_read (patches/0005).
//
// Safety: every entry names the model (a hash of its weights) and everything else that decides
// the KV bits (compat hash: llama.cpp pin and patches, CPU flags, attention settings, row
// layout); a mismatch is a miss, never wrong KV. A bad entry is removed and counted. Writes go
// to a temporary file that is fsynced and renamed, so readers (other processes included) never
// see half an entry; readers keep an open file readable while another process replaces or
// removes it (POSIX), so no locks are needed. The directory must be one only this user can
// write (kv/disk-dir).

#include "kv/disk-entry.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

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
    // token by token; never an extension whose parents are not all there. `chain` holds the chained hashes of the blocks of `tokens`. miss says
    // why nothing matched: not_stored, or incompatible when only entries for another model or
    // build hold these tokens.
    match find(const llama_opt_persist_layout & layout, const std::vector<uint64_t> & chain,
               const llama_token * tokens, size_t max_blocks) const;

    // Reads the rows of blocks [first, last) of an entry into dst (block_size * bytes_per_token
    // per block), checking each block's checksum; an extension's blocks below base_blocks from
    // its parents. Returns the number of blocks read; fewer means the rest was gone (miss =
    // not_stored: another process removed the entry, or a parent is missing or does not agree)
    // or unreadable or corrupt (miss = corrupt: the entry holding the bad block is removed);
    // `why` says what happened. Marks the entry and its parents used.
    uint32_t load(const llama_opt_persist_entry & entry, uint32_t first, uint32_t last, uint8_t * dst,
                  std::string & why, llama_opt_persist_miss & miss) const;

    // Stores a context: n_tokens = chain.size() * block_size tokens and their rows, position-
    // major, as a whole entry. Atomic; entries whose tokens are a prefix of this one are
    // removed (this one restores them too) unless another entry extends them; with max_bytes >
    // 0, least recently used other entries are removed until the directory fits (see cleanup),
    // and an entry larger than max_bytes is not stored. Returns false (and why) on an I/O error
    // or that: nothing is left behind.
    bool save(const llama_opt_persist_layout & layout, const std::vector<llama_token> & tokens,
              const std::vector<uint64_t> & chain, const uint8_t * rows, std::string & why,
              uint64_t max_bytes = 0) const;
    // save(), for a context whose first n_base blocks `base` holds (a match of find()): if `base`
    // ends there, an extension of it (its rows are not written again, and it is kept); if it
    // holds more (a branch), its rows are read and a whole entry written. `rows` holds blocks
    // [n_base, chain.size()). Returns the bytes written, 0 (and why) if nothing was: `base` gone
    // or changed, an I/O error.
    uint64_t save_extending(const llama_opt_persist_layout & layout, const std::vector<llama_token> & tokens,
                            const std::vector<uint64_t> & chain, const llama_opt_persist_entry * base, uint32_t n_base,
                            const uint8_t * rows, std::string & why, uint64_t max_bytes = 0) const;

    // Every entry (headers only; `problem` set for unreadable ones) and the total size.
    std::vector<llama_opt_persist_entry> list() const;
    // Reads a whole entry and checks every checksum (an extension's own blocks), and that an
    // extension's parent is there; empty if it is sound.
    std::string verify(const std::string & path) const;
    // Removes entries older than max_age_s seconds (0: no age limit), then the least recently
    // used ones until the total is at most max_bytes (0: no limit), and temporary files of
    // interrupted saves older than an hour; never `keep` nor its parents. Extensions whose parent
    // is gone (orphans: nothing of them restorable) go too, as soon as the parent goes. Returns
    // the number of files removed.
    size_t cleanup(int64_t max_age_s, uint64_t max_bytes, const std::string & keep = "") const;
    // Removes one entry; false if it was not there.
    bool remove(const std::string & path) const;
    // Marks an entry used now (its mtime: the order in which cleanup removes entries), and its
    // parents after it (never older than their children).
    void touch(const std::string & path) const;

    // A run of failed saves (a full disk, a read-only directory) is one warning, not one per save:
    // true for the first failure since the last success; the rest are counted (persist_errors).
    bool first_failure() const { return !failing_.exchange(true); }
    void saved() const { failing_ = false; }

    // Test hook: saves fail after writing this many bytes of their temporary file, as on a full
    // disk (0: off).
    void fail_after_bytes(uint64_t n) { fail_after_ = n; }

private:
    std::string           dir_;
    std::atomic<uint64_t> fail_after_{ 0 };  // (set by a test while the background writer saves)
    mutable std::atomic<bool> failing_{ false };  // (both the session's saves and the background writer's)

    // The names of the directory's entries (not the temporary files of saves), in order.
    std::vector<std::string> entry_names() const;
    // Creates the file `name` with what `fill` writes, atomically: a temporary file, fsynced,
    // renamed. False (and why) on an error: nothing is left behind.
    bool write_atomically(const std::string & name, const std::function<bool(const llama_opt_persist_writer &)> & fill,
                          std::string & why) const;
    // The entry and its parents, child first, as far as each parent is there and agrees with its
    // child (layout, chained hashes, tokens).
    std::vector<llama_opt_persist_entry> lineage(const llama_opt_persist_entry & e) const;
    // The path of the entry an extension extends ("" for a whole entry).
    std::string parent_path(const llama_opt_persist_entry & e) const;
    std::set<std::string> parent_paths(const std::vector<llama_opt_persist_entry> & entries) const;
    void touch_lineage(const std::vector<llama_opt_persist_entry> & line) const;
    void touch_file(const std::string & path) const;
    // Removes the entries holding a prefix of `chain` (but `path`) that no entry extends.
    void remove_subsumed(const llama_opt_persist_layout & layout, const std::vector<uint64_t> & chain,
                         const std::string & path) const;
};
