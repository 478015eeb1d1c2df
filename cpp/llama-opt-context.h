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
#include "llama-opt-attn-capture.h"
#include "llama-opt-h2o-capture.h"
#include "llama-opt-op-profile.h"
#include "llama-kv-cache-persist-store.h"
#include "llama-memo.h"
#include "llama-opt-model.h"
#include "llama-opt-spec-prefill.h"
#include "llama-opt.h"
#include "llama.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <vector>

struct llama_context;

// What the context asks of whoever owns a sequence (a session), without knowing its type: the
// context holds the KV memory and may take a sequence's KV away.
class llama_opt_seq_owner {
public:
    virtual ~llama_opt_seq_owner() = default;
    // The sequence's KV and pooled blocks are gone (the cache needed the room); the owner must
    // not use the sequence again.
    virtual void on_evicted() = 0;
    // The sequence's KV is about to be freed (the context closes, or the cache evicts the
    // sequence for room): the last moment to save it (never throws).
    virtual void on_kv_leaving() = 0;
    // A generation is going on: the owner is never evicted for room (the one needing room is
    // told the cache is full instead), so that no stream loses its session midway.
    virtual bool in_use() const = 0;
};

// One row of a decode call: a token of some sequence at some position. Rows of several
// sequences can share one call.
struct llama_opt_row {
    int32_t     seq;
    size_t      pos;
    llama_token token;
};

// Whether a sequence's KV can be rearranged in place (llama_opt_context::kv_prepare_in_place), or why not.
enum class llama_opt_in_place {
    possible,
    unsupported,  // the KV memory cannot move rows (flash attention off: V stored transposed)
    shared,       // an open session holds cells past the edit too
    no_room,      // no room above the sequence's cells for the history's growth
};

// Work a compute call did, for the caller's statistics.
struct llama_opt_work {
    uint64_t tokens = 0;
    uint64_t passes = 0;  // forward passes (llama_decode calls)
    uint64_t us     = 0;  // time inside them
};

// What an H2O prefill did (compute_span_h2o), for the statistics.
struct llama_opt_h2o_work {
    uint64_t chunks      = 0;  // chunks computed with attention subsets
    uint64_t tokens_kept = 0;  // memory-set entries, summed over chunks, layers and heads
    uint64_t select_us   = 0;  // time in subsets, score updates and memory-set construction
};

struct llama_opt_context_params {
    uint32_t n_ctx           = 4096;  // KV cells shared by all sessions
    uint32_t n_batch         = 512;   // tokens per llama_decode call (= one ubatch)
    uint32_t n_seq_max       = 8;     // sequences: open sessions plus cached (closed) ones
    int32_t  n_threads       = 0;     // 0 = all hardware threads
    int32_t  n_threads_batch = 0;     // 0 = n_threads
    bool     flash_attn      = true;  // fixed per context: numerics depend on it
    bool     swa_full        = true;  // keep every token of sliding-window layers (prefix reuse needs them)
    bool     canonical       = true;  // canonical block schedule; false: llama.cpp's own, no reuse
    llama_opt_profile_mode profile = llama_opt_profile_mode::none;  // a diagnostic (llama-opt-op-profile.h)
};

// The context owns the KV memory, the block pool and the compute. Sessions (llama-opt-session)
// use it through the operations below, each on a sequence id; callers hold mutex().
class llama_opt_context {
public:
    llama_opt_context(std::shared_ptr<llama_opt_model> model, const llama_opt_context_params & params,
                      const llama_opt_settings & settings);
    ~llama_opt_context();

    llama_opt_context(const llama_opt_context &)             = delete;
    llama_opt_context & operator=(const llama_opt_context &) = delete;

    // A free sequence id for `owner` (a cached sequence is given up if none is free). Throws
    // llama_opt_error(context_overflow) when every sequence is taken by an open session.
    int32_t acquire_seq(std::weak_ptr<llama_opt_seq_owner> owner);
    // The owner is done with `seq`: its complete pooled blocks stay cached for reuse (dedup on),
    // the rest of its KV is freed. Nothing happens if `seq` was evicted and is someone else's now.
    void release_seq(int32_t seq, const llama_opt_seq_owner * owner, bool keep_blocks = true);

    // Frees the llama context; owners are told first (on_kv_leaving).
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
    // A sequence id no session uses: KV parked there while a session is rearranged (Tier-2 sync).
    int32_t  scratch_seq() const { return (int32_t) params_.n_seq_max; }
    bool     dedup() const { return pool_ != nullptr; }
    // kv-cache-persist: the disk tier, if persist_enabled (else null), and what its entries must match
    llama_opt_persist_store *        persist() const { return persist_.get(); }
    const llama_opt_persist_layout & persist_layout() const { return persist_layout_; }
    uint32_t kv_cells_used() const;
    // The queries the model computes, observed for attention scores (llama-opt-attn-capture):
    // null unless a Tier-2 method that needs them is on (attn_prune_enabled, spec_prefill_enabled).
    llama_opt_attn_capture * attn_capture() const { return attn_capture_.get(); }
    // Speculative prefill's draft scorer (spec_prefill_draft_model), null if none.
    llama_opt_spec_draft *   spec_draft() const { return spec_draft_.get(); }
    llama_opt_op_profile *   op_profile() const { return op_profile_.get(); }  // null unless params.profile
    // memo: its sessions' recent outputs, where each of them looks for drafts too (memo_shared)
    llama_opt_memo_outputs &       memo_outputs() { return memo_outputs_; }
    const llama_opt_memo_outputs & memo_outputs() const { return memo_outputs_; }

    llama_opt_stats stats() const;
    void            reset_stats();
    void            count(uint64_t llama_opt_stats::* counter, uint64_t n) { stats_.*counter += n; }

    // Chained hash of one block (llama-context-hash), masked by the test hook below.
    uint64_t block_hash(uint64_t parent, const llama_token * block) const;

    // Test hook: keep only these bits of every block hash, to force collisions. Lookups are
    // verified (tokens and parent block), so this must never change a result.
    void set_test_hash_mask(uint64_t mask) { hash_mask_ = mask; }
    // Sliding-window layers attend over the cache from the window's first cell (patches/0013; on in
    // a canonical context): the same bits, less work at long contexts. Off: llama.cpp's whole-cache
    // view, for tests and measurements.
    void set_swa_view(bool on);

    // The lock every session operation holds: a llama_context is not thread-safe.
    std::recursive_mutex & mutex() const { return mutex_; }

    // --- compute ---

    // Computes KV for tokens[begin, end) of `seq` at positions begin..end-1; with `logits`,
    // copies the logits of the last token there. Chunks of n_batch tokens (canonical: begin is
    // a multiple of row_align(), chunk_ tokens each, and a remainder smaller than min_chunk()
    // joins the chunk before it). When the cache is full, cached sequences and then (if
    // evict_sessions) idle sequences are evicted, least recently used first. On failure the KV
    // of [begin, end) is removed and llama_opt_error is thrown. Adds the work done to `work`,
    // also when it fails (work thrown away, which the statistics must show too).
    void compute_span(int32_t seq, const llama_token * tokens, size_t begin, size_t end, std::vector<float> * logits,
                      bool evict_sessions, llama_opt_work & work);
    // Computes `rows` in one batch (at most LLAMA_OPT_ROW_INVARIANT_BATCH rows: each computes
    // like a one-token decode step, patches/0006) with the logits of every row, row after row,
    // into `logits`. Rows may belong to several sequences. Returns false, with nothing computed,
    // when the cache has no room for them as it is (nothing is evicted for them). Adds the work to `work`.
    bool compute_rows(const std::vector<llama_opt_row> & rows, std::vector<float> & logits, llama_opt_work & work);
    // Tier 2, H2O (docs/h2o.md): computes tokens[0, end) of `seq`, which has no KV, in chunks of
    // h2o_chunk_size tokens, each full-attention layer attending to the chunk and to its memory
    // set (patches/0010), with the logits of the last token. The KV of every token is stored. On
    // failure the KV of the sequence is removed and llama_opt_error is thrown. Null capture
    // (h2o_enabled off): llama_opt_error.
    void compute_span_h2o(int32_t seq, const llama_token * tokens, size_t end, std::vector<float> * logits,
                          llama_opt_work & work, llama_opt_h2o_work & h2o_work);
    // Tier 2 (speculative prefill, shifted reuse): computes tokens[p] at position p for each of
    // `positions` (increasing, none held by the sequence: above its KV, the positions between
    // getting none (patches/0011), or in the gaps of its KV (0012)), in chunks of n_batch, with the
    // logits of the last there. On failure the sequence's KV from positions[0] on is removed;
    // eviction as compute_span.
    void compute_positions(int32_t seq, const llama_token * tokens, const std::vector<size_t> & positions,
                           std::vector<float> & logits, bool evict_sessions, llama_opt_work & work);
    // Tier 2 (speculative prefill): 001's importance of tokens[begin, end) scored by the model's
    // first `n_layers` layers on `seq` (on top of its KV of [0, begin), which must end there):
    // the span is computed up to those layers (llama-opt-attn-capture's scorer mode), and its
    // cells removed again. Empty if the scorer saw no query (a model whose tensors it does not know).
    std::vector<float> score_span(int32_t seq, const llama_token * tokens, size_t begin, size_t end,
                                  uint32_t n_layers, uint32_t window, uint32_t last_layers, uint32_t pool,
                                  bool evict_sessions, llama_opt_work & work);

    // --- the KV memory of a sequence ---

    // Removes the KV of positions >= pos. Inside the prefix whose cells other sequences may
    // hold too, the cut moves down to a block boundary (a shared tile is never written), and
    // pooled blocks from there on are let go. Returns where the sequence's KV now ends.
    size_t kv_truncate(int32_t seq, size_t pos);
    // Removes the KV of [p0, p1) (p1 < 0: to the end) without any bookkeeping: cells no block
    // or shared prefix covers (unconfirmed drafts, the scratch sequence).
    void   kv_remove(int32_t seq, llama_pos p0, llama_pos p1);
    // Tier 2: the KV of [p0, p1) leaves the sequence (a hole; the positions of the rest stay),
    // and so do its pooled blocks from the one p0 is in.
    void   kv_drop(int32_t seq, size_t p0, size_t p1);
    // `dst` takes `src`'s cells of [p0, p1): stored once, held by both.
    void   kv_share(int32_t src, int32_t dst, size_t p0, size_t p1);
    // Tier-2 sync rebuilds a history in position order around the unchanged spans after an edit,
    // without room for a second copy of them. First kv_prepare_in_place: whether the KV of `seq`
    // can be rearranged in its own cells for a history going from n_old to n_new tokens, its
    // positions >= keep the sequence's alone and room above its cells for the growth; cached
    // sequences sharing those cells or taking that room are evicted. Then kv_park moves the KV of
    // [from, from + n) to [to, to + n) within the sequence's cells, parked on the scratch sequence
    // (patches/0005; false: not possible after all), whose rows reserve their tiles (patches/0008);
    // kv_unpark gives [p0, p1) back once the tokens before it are computed.
    llama_opt_in_place kv_prepare_in_place(int32_t seq, size_t keep, size_t n_old, size_t n_new);
    // Room for the history of `seq` to grow from n_old to n_new tokens: its new blocks go into empty
    // tiles above its highest one (all of the cache's, for a sequence without KV). Frees cached
    // sequences holding cells up there (and, with evict_sessions, then idle sessions), least recently
    // used first, until there is room; false if there is none even then. Nothing is computed, so a
    // caller that checks first never throws work away.
    bool   kv_make_room(int32_t seq, size_t n_old, size_t n_new, bool evict_sessions);
    // Whether an empty tile lies above the highest one of `seq` (its history can start one more).
    bool   kv_tile_above(int32_t seq) const;
    // Whether `seq`, its KV dropped, would find room for n_new tokens computed again from the bottom:
    // the empty tiles and its own that no other sequence shares, cached sequences then idle sessions
    // evicted (least recently used first) until they are enough. `seq` itself is not touched.
    bool   kv_room_after_drop(int32_t seq, size_t n_new);
    // The error of a full KV cache (context_overflow), with what to do.
    llama_opt_error kv_full() const;
    bool   kv_park(int32_t seq, size_t from, size_t to, size_t n);
    void   kv_unpark(int32_t seq, size_t p0, size_t p1);
    void   kv_clear_parked();
    int32_t kv_cell(int32_t seq, size_t pos) const;  // the cell holding a position, -1 if none (patches/0004)
    size_t kv_end(int32_t seq) const;  // one past the last position of the sequence in the KV memory
    size_t kv_top(int32_t seq) const;  // one past the sequence's highest cell (canonical placement), 0 if none
    // The KV rows of [p0, p1) as the disk tier stores them; false if some are not in the cache.
    bool   kv_read(int32_t seq, size_t p0, size_t p1, uint8_t * rows) const;
    // Writes KV rows read by kv_read into [p0, p1), evicting cached sequences for room; false: no room.
    bool   kv_write(int32_t seq, size_t p0, size_t p1, const uint8_t * rows);

    // --- the pooled blocks a sequence holds (dedup) ---

    llama_opt_block_pool *        pool() { return pool_.get(); }
    const std::vector<uint64_t> & held_blocks(int32_t seq) const { return slots_[seq].blocks; }
    // `seq` holds `block` as its next block (its cells hold the block's KV).
    void hold_block(int32_t seq, const llama_opt_kv_block * block);
    // pool()->insert, freeing cached sequences for room if the pool is full; nullptr if none can go.
    const llama_opt_kv_block * pool_insert(int32_t seq, uint64_t hash, uint64_t parent, uint32_t index,
                                           const llama_token * tokens);

private:
    enum class slot_state { free, session, cached };
    struct slot {
        slot_state                         state = slot_state::free;
        std::weak_ptr<llama_opt_seq_owner> owner;
        const llama_opt_seq_owner *        owner_id = nullptr;  // identity, also while it is being destroyed
        uint64_t                           last_use = 0;
        size_t                             n_shared = 0;  // [0, n_shared) may be cells other sequences hold too
        std::vector<uint64_t>              blocks;        // pool ids of the blocks its cells hold, in order
    };

    void touch(int32_t seq);
    // Frees the least recently used cached sequence (or, unless cached_only, idle session)
    // other than `except` (and with `above`, holding a cell at or above that index); false if there is none.
    bool evict_one(int32_t except, bool cached_only = false, size_t above = 0);
    // llama_decode; while there is no room (1) and `evict`, frees least recently used KV
    // (cached sequences, then if evict_sessions idle sessions) and retries. Throws
    // decode_failed on other errors. Adds the time it took to work.us.
    int32_t decode_evicting(int32_t seq, const llama_batch & batch, bool evict, bool evict_sessions, llama_opt_work & work);
    // One chunk of a sequence's tokens: decode_evicting (evicting as compute_span says), kv_full()
    // thrown when there is no room even so; the tokens and the pass added to `work`.
    void    decode_chunk(int32_t seq, const llama_batch & batch, bool evict_sessions, llama_opt_work & work);
    // Frees the least recently used cached sequence that alone holds a pooled block, so that
    // the pool gets room; false if there is none.
    bool evict_for_pool(int32_t except);
    void release_blocks(int32_t seq, size_t keep);  // lets go of the pooled blocks from `keep` on
    void drop_sequence(int32_t seq);       // frees a sequence's KV, pool references and id
    void check_open() const;
    void open_persist_store();

    void check_h2o_settings(uint32_t n_batch) const;  // llama_opt_errc::config if H2O cannot work here

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
    std::unique_ptr<llama_opt_attn_capture>  attn_capture_;
    std::unique_ptr<llama_opt_h2o_capture>   h2o_capture_;
    std::unique_ptr<llama_opt_spec_draft>    spec_draft_;
    std::unique_ptr<llama_opt_op_profile>    op_profile_;
    llama_opt_persist_layout              persist_layout_;
    llama_opt_memo_outputs                memo_outputs_;
    std::vector<slot>                     slots_;           // by sequence id
    uint64_t                              clock_ = 0;       // for LRU
    uint64_t                              hash_mask_ = ~0ULL;
    llama_opt_stats                       stats_;
    mutable std::recursive_mutex          mutex_;
};
