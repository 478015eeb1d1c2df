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

    // Stores the complete canonical blocks on the disk tier unless an entry holds them already;
    // returns the tokens stored or held, 0 if writing failed (counted).
    size_t save();
    void   save_quietly();  // on close: never throws, failures are counted

private:
    void share_duplicate(size_t k, const llama_opt_kv_block * b);  // canon: store block k once
    std::vector<uint64_t> persist_chain(size_t n_blocks) const;    // unmasked chained hashes

    llama_opt_session_history &  history_;
    llama_opt_session_counters & counters_;
};
