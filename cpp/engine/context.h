#pragma once

// engine/context: one llama_context with a unified KV cache shared by many sessions (one
// sequence id each). It chooses the eval callback when it is made (a Tier-2 capture or an
// operation profile), computes KV for token spans and rows of sequences, and owns the KV memory
// (kv/memory: slots, block pool, placement, disk tier), as llama.cpp's llama_context
// owns a llama_memory_i. The Tier-2 algorithms that drive its compute live with their modules
// (methods/h2o-prefill, methods/spec-prefill).
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

#include "methods/attn-capture.h"
#include "methods/h2o-capture.h"
#include "kv/kv-codec.h"
#include "kv/memory.h"
#include "engine/op-profile.h"
#include "methods/memo.h"
#include "methods/memo-gate.h"
#include "methods/row-kernels.h"
#include "engine/model.h"
#include "methods/spec-prefill.h"
#include "base/config.h"
#include "base/numerics.h"
#include "base/stats.h"
#include "base/types.h"
#include "llama.h"

#include <array>
#include <algorithm>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

// One row of a decode call: a token of some sequence at some position. Rows of several
// sequences can share one call.
struct llama_opt_row {
    int32_t     seq;
    size_t      pos;
    llama_token token;
};

// The logits of each row of a span, as they are computed: (position, n_vocab logits), valid
// during the call only.
using llama_opt_row_logits = std::function<void(size_t pos, const float * logits)>;

// Work a compute call did, for the caller's statistics.
struct llama_opt_work {
    uint64_t tokens = 0;
    uint64_t passes = 0;  // forward passes (llama_decode calls)
    uint64_t us     = 0;  // time inside them
};

// A llama_batch of one sequence id per row, freed when it goes out of scope.
struct llama_opt_batch {
    llama_batch batch;
    int32_t     capacity;
    explicit llama_opt_batch(int32_t capacity) : batch(llama_batch_init(capacity, 0, 1)), capacity(capacity) {}
    ~llama_opt_batch() { llama_batch_free(batch); }
    llama_opt_batch(const llama_opt_batch &)             = delete;
    llama_opt_batch & operator=(const llama_opt_batch &) = delete;

    // Row i: `token` of `seq` at `pos`, with its logits if `logits`. Throws past the capacity.
    void set(int32_t i, int32_t seq, size_t pos, llama_token token, bool logits);
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
    llama_opt_profile_mode profile = llama_opt_profile_mode::none;  // a diagnostic (engine/op-profile.h)
};

// The context owns the llama_context, its KV memory and the compute. Sessions (session/session)
// compute through the operations below and keep their sequence's KV through memory(), each on a
// sequence id; callers hold mutex().
class llama_opt_context {
public:
    llama_opt_context(std::shared_ptr<llama_opt_model> model, const llama_opt_context_params & params,
                      const llama_opt_settings & settings);

    llama_opt_context(const llama_opt_context &)             = delete;
    llama_opt_context & operator=(const llama_opt_context &) = delete;

    // Frees the llama context; owners of sequences are told first (on_kv_leaving).
    void close();
    bool closed() const { return ctx_ == nullptr; }
    // llama_opt_error(session_closed) once closed.
    void check_open() const { memory_->check_open(); }

    // The KV memory: sequence slots, block pool, placement, rows, disk tier.
    llama_opt_kv_memory &       memory() { return *memory_; }
    const llama_opt_kv_memory & memory() const { return *memory_; }
    llama_context *             get() const { return ctx_.get(); }  // null once closed

    const llama_opt_model &    model() const { return *model_; }
    // How the cache stores K and V (kv_type), and the bytes one position takes in it, all layers.
    const llama_opt_kv_codec & kv_codec() const { return codec_; }
    uint64_t kv_bytes_per_token() const { return codec_.memory_bytes(*model_); }
    const llama_opt_settings & settings() const { return settings_; }
    uint32_t n_ctx() const { return n_ctx_; }
    uint32_t block_size() const { return block_; }
    // fewest tokens per canonical chunk: a smaller one computes its rows differently, and so
    // does a batch small enough to compute rows like decode steps (patches/0006)
    uint32_t min_chunk() const { return std::max(align_, LLAMA_OPT_ROW_INVARIANT_BATCH + row_align()); }
    uint32_t row_align() const { return 4; }       // canonical chunk boundaries are multiples of this
    bool     canonical() const { return params_.canonical; }
    // The queries the model computes, observed for attention scores (methods/attn-capture):
    // null unless a Tier-2 method that needs them is on (attn_prune_enabled, spec_prefill_enabled).
    llama_opt_attn_capture * attn_capture() const { return attn_capture_.get(); }
    // H2O chunks' softmax weights (methods/h2o-capture): null unless h2o_enabled.
    llama_opt_h2o_capture *  h2o_capture() const { return h2o_capture_.get(); }
    // Speculative prefill's draft scorer (spec_prefill_draft_model), null if none.
    llama_opt_spec_draft *   spec_draft() const { return spec_draft_.get(); }
    llama_opt_op_profile *   op_profile() const { return op_profile_.get(); }  // null unless params.profile
    // memo: its sessions' recent outputs, where each of them looks for drafts too (memo_shared)
    llama_opt_memo_outputs &       memo_outputs() { return memo_outputs_; }
    const llama_opt_memo_outputs & memo_outputs() const { return memo_outputs_; }
    llama_opt_memo_gate &          memo_gate() { return memo_gate_; }  // whether drafts pay here
    const llama_opt_row_kernels &  row_kernels() const { return row_kernels_; }  // small batches' kernels (row_kernels 2)

    // Statistics: each counter has one writer. A session counts its work in its own statistics
    // (session/counters), which the context follows and adds up, those of sessions that are gone
    // too; the context counts its own work (evictions, batches of several sessions' rows).
    llama_opt_stats stats() const;
    void            reset_stats();
    void            count_batch(const llama_opt_work & work);  // a batch of several sessions' decode rows
    // A session's statistics: in stats() from now on, also after unfollow (the session is gone).
    void            follow(const llama_opt_stats & session_stats);
    void            unfollow(const llama_opt_stats & session_stats);

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
    // With `each_row`, every row of every chunk outputs logits, handed to it chunk by chunk. The
    // KV is the same (llama.cpp selects the output rows after the last layer's attention), the
    // last row's logits are not: the last layer's FFN and the output layer then run over the
    // whole chunk, a matrix product of another size (docs/exactness.md, "Echo").
    void compute_span(int32_t seq, const llama_token * tokens, size_t begin, size_t end, std::vector<float> * logits,
                      bool evict_sessions, llama_opt_work & work, const llama_opt_row_logits & each_row = nullptr);
    // Computes `rows` in one batch (at most LLAMA_OPT_ROW_INVARIANT_BATCH rows: each computes
    // like a one-token decode step, patches/0006) with the logits of every row, row after row,
    // into `logits`. Rows may belong to several sequences. Returns false, with nothing computed,
    // when the cache has no room for them as it is (nothing is evicted for them). Adds the work to `work`.
    bool compute_rows(const std::vector<llama_opt_row> & rows, std::vector<float> & logits, llama_opt_work & work);
    // Tier 2 (speculative prefill, shifted reuse): computes tokens[p] at position p for each of
    // `positions` (increasing, none held by the sequence: above its KV, the positions between
    // getting none (patches/0011), or in the gaps of its KV (0012)), in chunks of n_batch, with the
    // logits of the last there. On failure the sequence's KV from positions[0] on is removed;
    // eviction as compute_span.
    void compute_positions(int32_t seq, const llama_token * tokens, const std::vector<size_t> & positions,
                           std::vector<float> & logits, bool evict_sessions, llama_opt_work & work);
    // One chunk of a sequence's tokens: decode_evicting (evicting as compute_span says), the memory's
    // full_error() thrown when there is no room even so; the tokens and the pass added to `work`.
    void decode_chunk(int32_t seq, const llama_batch & batch, bool evict_sessions, llama_opt_work & work);
    // The logits of the last row of the last decode call, into `logits`.
    void last_logits(std::vector<float> & logits) const;

private:
    // llama_decode; while there is no room (1) and `evict`, frees least recently used KV
    // (cached sequences, then if evict_sessions idle sessions) and retries. Throws
    // decode_failed on other errors. Adds the time it took to work.us.
    int32_t decode_evicting(int32_t seq, const llama_batch & batch, bool evict, bool evict_sessions, llama_opt_work & work);
    // the calling thread's row-kernel table for a decode of n_tokens (config row_kernels); true: timed
    bool set_row_kernel_table(int32_t n_tokens);
    void row_kernels_measured(bool decoded);  // after a timed decode: its small batches' times to the chooser
    llama_opt_stats sessions_sum() const;  // every session's statistics, those gone included

    struct context_deleter {
        void operator()(llama_context * ctx) const { llama_free(ctx); }
    };

    std::shared_ptr<llama_opt_model>         model_;
    llama_opt_context_params                 params_;
    llama_opt_settings                       settings_;
    uint32_t                                 n_ctx_  = 0;
    uint32_t                                 block_  = 0;
    uint32_t                                 align_  = 1;  // cell tile and minimum chunk (measured numerics rule)
    uint32_t                                 chunk_  = 0;  // canonical chunk: largest multiple of block_ <= n_batch
    llama_opt_kv_codec                       codec_;
    llama_opt_stats                          stats_;       // its own work (before memory_, which counts its evictions here)
    std::vector<const llama_opt_stats *>     followed_;    // the statistics of its sessions
    llama_opt_stats                          gone_;        // of the sessions no longer followed
    llama_opt_stats                          at_reset_;    // the sessions' sum at the last reset_stats()
    std::unique_ptr<llama_opt_attn_capture>  attn_capture_;
    std::unique_ptr<llama_opt_h2o_capture>   h2o_capture_;
    std::unique_ptr<llama_opt_op_profile>    op_profile_;
    std::unique_ptr<llama_opt_spec_draft>    spec_draft_;
    std::unique_ptr<llama_context, context_deleter> ctx_;  // (after the callbacks' observers: freed first)
    std::unique_ptr<llama_opt_kv_memory>     memory_;
    llama_opt_memo_outputs                   memo_outputs_;
    llama_opt_memo_gate                      memo_gate_;
    llama_opt_row_kernels                    row_kernels_;
    std::array<uint32_t, llama_opt_row_kernels::max_types> row_kernel_masks_{};  // the table of the decode in flight
    mutable std::recursive_mutex             mutex_;
};
