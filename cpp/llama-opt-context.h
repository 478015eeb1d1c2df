#pragma once

// llama-opt-context: one llama_context with a unified KV cache shared by many sessions (one
// sequence id each). It computes KV for token spans of a sequence, owns the block pool that
// lets sessions share the KV of a common prefix, and evicts least recently used KV when the
// cache is full.
//
// Canonical schedule (the default): KV is computed in chunks whose boundaries are multiples of
// row_align() and that hold at least min_chunk() tokens, and every sequence's cells are placed
// tile-aligned and in position order (patches/0001). Measured on this build: then a token's KV
// does not depend on how the history was chunked, except for the last tokens of a chunk that
// do not fill a group of row_align(), which are computed again when the history grows. So KV
// and logits are pure functions of the tokens, whatever the history was built from, which
// makes sharing and reuse bitwise exact (docs/exactness.md). Reuse off means: the same
// schedule, computing everything. The "llama" schedule is llama.cpp's own (n_batch chunks from
// where the new tokens start, default placement), without reuse.

#include "llama-kv-cache-dedup.h"
#include "llama-kv-cache-persist.h"
#include "llama-opt-model.h"
#include "llama-opt.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <vector>

struct llama_context;
struct llama_batch;
class llama_opt_session;

struct llama_opt_context_params {
    uint32_t n_ctx           = 4096;  // KV cells shared by all sessions
    uint32_t n_batch         = 512;   // tokens per llama_decode call (= one ubatch)
    uint32_t n_seq_max       = 8;     // sequences: open sessions plus cached (closed) ones
    int32_t  n_threads       = 0;     // 0 = all hardware threads
    int32_t  n_threads_batch = 0;     // 0 = n_threads
    bool     flash_attn      = true;  // fixed per context: numerics depend on it
    bool     swa_full        = true;  // keep every token of sliding-window layers (prefix reuse needs them)
    bool     canonical       = true;  // canonical block schedule; false: llama.cpp's own, no reuse
};

class llama_opt_context : public std::enable_shared_from_this<llama_opt_context> {
public:
    llama_opt_context(std::shared_ptr<llama_opt_model> model, const llama_opt_context_params & params,
                      const llama_opt_settings & settings);
    ~llama_opt_context();

    llama_opt_context(const llama_opt_context &)             = delete;
    llama_opt_context & operator=(const llama_opt_context &) = delete;

    // Throws llama_opt_error(context_overflow) when every sequence is taken by an open session.
    std::shared_ptr<llama_opt_session> open_session();

    // Frees the llama context; open sessions become closed.
    void close();
    bool closed() const { return ctx_ == nullptr; }

    const llama_opt_model &          model() const { return *model_; }
    const llama_opt_settings &       settings() const { return settings_; }
    const llama_opt_context_params & params() const { return params_; }
    uint32_t n_ctx() const { return n_ctx_; }
    uint32_t n_sessions() const;   // open sessions
    uint32_t n_cached() const;     // closed sessions whose blocks are kept for reuse
    uint32_t block_size() const { return block_; }
    // fewest tokens per canonical chunk: a smaller one computes its rows differently, and so
    // does a batch small enough to compute rows like decode steps (patches/0006)
    uint32_t min_chunk() const { return std::max(align_, LLAMA_OPT_ROW_INVARIANT_BATCH + row_align()); }
    uint32_t row_align() const { return 4; }       // canonical chunk boundaries are multiples of this
    bool     canonical() const { return params_.canonical; }
    // A sequence id no session uses: KV parked there while a session is rearranged.
    int32_t  scratch_seq() const { return (int32_t) params_.n_seq_max; }
    bool     dedup() const { return pool_ != nullptr; }
    // kv-cache-persist: the disk tier, if persist_enabled (else null), and what its entries must match
    llama_opt_persist_store *        persist() const { return persist_.get(); }
    const llama_opt_persist_layout & persist_layout() const { return persist_layout_; }
    uint32_t kv_cells_used() const;

    llama_opt_stats stats() const;
    void            reset_stats();

    // Chained hash of one block (llama-context-hash), masked by the test hook below.
    uint64_t block_hash(uint64_t parent, const llama_token * block) const;

    // Test hook: keep only these bits of every block hash, to force collisions. Lookups are
    // verified (tokens and parent block), so this must never change a result.
    void set_test_hash_mask(uint64_t mask) { hash_mask_ = mask; }

    // The lock every session operation holds: a llama_context is not thread-safe.
    std::recursive_mutex & mutex() const { return mutex_; }

private:
    friend class llama_opt_session;

    enum class slot_state { free, session, cached };
    struct slot {
        slot_state                       state = slot_state::free;
        std::weak_ptr<llama_opt_session> session;
        const llama_opt_session *        owner = nullptr;  // identity, also while it is being destroyed
        uint64_t                         last_use = 0;
    };

    // Computes KV for tokens[begin, end) of `seq` at positions begin..end-1 and copies the
    // logits of the last token into `logits`. Chunks of n_batch tokens (canonical: begin is a
    // multiple of row_align(), chunk_ tokens each, and a remainder smaller than min_chunk()
    // joins the chunk before it).
    // When the cache is full, cached sequences and then (if evict_sessions) idle sessions are
    // evicted, least recently used first. On failure the KV of [begin, end) is removed and
    // llama_opt_error is thrown.
    // With logits=false nothing is output (KV only; the session's logits stay as they were).
    void decode(llama_opt_session & s, size_t begin, size_t end, uint64_t llama_opt_stats::* counter,
                bool evict_sessions, bool logits = true);
    // memo: computes `rows` at positions [pos, pos + rows.size()) of s's sequence in one batch
    // (at most LLAMA_OPT_ROW_INVARIANT_BATCH rows: each computes like a one-token decode step,
    // patches/0006), with the logits of every row, row after row, into `logits`. Returns false,
    // with nothing computed, when the cache has no room for them as it is (nothing is evicted).
    bool decode_rows(llama_opt_session & s, size_t pos, const std::vector<llama_token> & rows,
                     std::vector<float> & logits);

    void count(llama_opt_session & s, uint64_t llama_opt_stats::* counter, uint64_t n);
    void mark_shared(int32_t seq, size_t n_shared);  // another sequence now holds [0, n_shared) of seq's cells too
    void touch(int32_t seq);
    // Frees the least recently used cached sequence (or, unless cached_only, idle session)
    // other than `except`; false if there is none.
    bool evict_one(int32_t except, bool cached_only = false);
    // llama_decode; while there is no room (1) and `evict`, frees least recently used KV
    // (cached sequences, then if evict_sessions idle sessions) and retries. Throws
    // decode_failed on other errors.
    int32_t decode_evicting(llama_opt_session & s, const llama_batch & batch, bool evict, bool evict_sessions);
    // Frees the least recently used cached sequence that alone holds a pooled block, so that
    // the pool gets room; false if there is none.
    bool evict_for_pool(int32_t except);
    void drop_sequence(int32_t seq);       // frees a sequence's KV, pool references and id
    void retire(llama_opt_session & s);    // a closing session's blocks stay cached
    void check_open() const;
    void open_persist_store();

    llama_opt_block_pool * pool() { return pool_.get(); }

    std::shared_ptr<llama_opt_model>      model_;
    llama_opt_context_params              params_;
    llama_opt_settings                    settings_;
    llama_context *                       ctx_       = nullptr;
    uint32_t                              n_ctx_     = 0;
    uint32_t                              block_     = 0;
    uint32_t                              align_     = 1;  // cell tile and minimum chunk (measured numerics rule)
    uint32_t                              chunk_     = 0;  // canonical chunk: largest multiple of block_ <= n_batch
    std::unique_ptr<llama_opt_block_pool> pool_;
    std::unique_ptr<llama_opt_persist_store> persist_;
    llama_opt_persist_layout              persist_layout_;
    std::vector<slot>                     slots_;           // by sequence id
    std::vector<std::vector<uint64_t>>    cached_blocks_;   // pool ids held by cached sequences
    uint64_t                              clock_ = 0;       // for LRU
    uint64_t                              hash_mask_ = ~0ULL;
    llama_opt_stats                       stats_;
    mutable std::recursive_mutex          mutex_;
};
