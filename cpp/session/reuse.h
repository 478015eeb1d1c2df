#pragma once

// session/reuse: the KV a session takes instead of computing it, and gives for others
// to take. From RAM: a longer canonical prefix other sequences hold (dedup: the block pool), a
// block computed again although another sequence holds it stored once (kv-cache-canon); from
// the disk tier (kv-cache-persist): a longer prefix stored there, and the complete canonical
// blocks written there on save and close. The block pool and the cells are the context's; the
// history's account moves with them (session/history).

#include "session/history.h"

class llama_opt_session_reuse {
public:
    llama_opt_session_reuse(llama_opt_session_history & history, llama_opt_session_counters & counters)
        : history_(history), counters_(counters) {}

    // dedup: takes a longer canonical prefix of the history than it has from another sequence
    void adopt_shared_prefix();
    // persist: takes a longer canonical prefix of the history, up to what computing to `end` will not
    // compute again, from the disk tier
    void restore_from_disk(size_t end);
    // [0, end) was computed on the canonical schedule: its new complete blocks join the pool
    void computed_canonically(size_t end);
    // puts the new complete canonical blocks into the pool
    void register_blocks();
    // A fork (history_.fork_to) holds the pooled blocks of this sequence too.
    void share_blocks_with(int32_t fork_seq) const;

    // Stores the complete canonical blocks on the disk tier unless an entry holds them already
    // (with write-behind, after the session's queued jobs are written); returns the tokens stored
    // or held, 0 if writing failed (counted).
    size_t save();
    // On close and eviction, the last moment the KV is there: queued for the background writer
    // (write-behind), else saved. Never throws; failures are counted.
    void   save_on_leaving();
    // Write-behind (kv/disk-writer): queues the complete canonical blocks that this session has not
    // queued yet and no entry it knows of holds, their rows copied out of the cache now; never waits.
    void   write_behind();
    // The session's KV is not to be trusted (discard): its queued blocks are not written.
    void   cancel_write_behind() const;
    // A fork starts with what this session queued or found on disk.
    void   copy_write_behind_to(llama_opt_session_reuse & fork) const { fork.on_disk_ = on_disk_; }
    // The background writer's counts for this session's jobs.
    void   add_write_behind_counts(llama_opt_stats & stats) const { account_->counts.add_to(stats); }

private:
    void share_duplicate(size_t k, const llama_opt_kv_block * b);  // canon: store block k once
    std::vector<uint64_t> persist_chain(size_t n_blocks) const;    // unmasked chained hashes
    // an entry holds (or a queued job will hold) the first n blocks of `chain`
    void known_on_disk(const std::vector<uint64_t> & chain, size_t n);

    llama_opt_session_history &  history_;
    llama_opt_session_counters & counters_;
    // write-behind: the chained hashes of the blocks queued or known on disk (a prefix of the
    // history's once it is compared), and the writer's side of this session
    std::vector<uint64_t>                      on_disk_;
    std::shared_ptr<llama_opt_persist_account> account_ = std::make_shared<llama_opt_persist_account>();
};
