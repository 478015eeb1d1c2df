#pragma once

// kv/memory: the KV memory of a context, the one owner of its cells, as llama.cpp's
// llama_context owns a llama_memory_i. It hands out sequence ids (slots) to sessions and takes
// them back (LRU eviction), keeps the block pool (which pooled blocks each sequence holds, which
// prefix it shares) and the disk tier's store, places a sequence's cells (tile-aligned, in
// position order: canonical placement, patches/0001), parks rows during a Tier-2 sync and reads
// and writes rows for the disk tier. Nothing else calls llama.h's memory API on a sequence.
//
// Invariants every operation keeps:
// - a sequence's [0, n_shared) may be cells other sequences hold too; a cut inside it moves down to a
//   block boundary, so a shared tile is never written;
// - a sequence's held blocks are pooled blocks whose KV its cells hold, in order from position 0;
//   pooled blocks past a cut are let go;
// - a cached sequence (a closed session's complete blocks) never writes again, and is the first to go
//   when room is needed, least recently used first; an open session in use is never evicted.
// Callers hold the context's mutex.

#include "kv/block-pool.h"
#include "kv/disk-store.h"
#include "kv/disk-writer.h"
#include "kv/kv-codec.h"
#include "engine/model.h"
#include "base/config.h"
#include "base/stats.h"
#include "base/types.h"
#include "llama.h"

#include <memory>
#include <vector>

// What the memory asks of whoever owns a sequence (a session), without knowing its type: the
// memory may take a sequence's KV away.
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

// Whether a sequence's KV can be rearranged in place (llama_opt_kv_memory::park), or why not.
enum class llama_opt_in_place {
    possible,
    unsupported,  // the KV memory cannot move rows (flash attention off: V stored transposed)
    shared,       // an open session holds cells past the edit too
    no_room,      // no room above the sequence's cells for the history's growth
};

// The KV of positions [from, from + n) of a sequence, to be moved to [to, to + n) (Tier-2 sync).
struct llama_opt_span_move {
    size_t from, to, n;
};

// The shape of a context's KV memory, fixed when the context is made.
struct llama_opt_kv_memory_params {
    uint32_t n_ctx      = 0;     // cells shared by all sequences
    uint32_t n_seq      = 0;     // sequence slots; id n_seq is the scratch sequence
    uint32_t block      = 0;     // tokens per pooled block
    uint32_t align      = 1;     // cell tile: a sequence's cells start at multiples of it (canonical)
    uint32_t row_align  = 1;     // canonical chunk boundaries are multiples of it (in the disk tier's identity)
    bool     canonical  = true;  // aligned placement; false: llama.cpp's own, no reuse
    bool     flash_attn = true;  // (numerics: in the disk tier's identity)
    bool     swa_full   = true;
    llama_opt_kv_codec codec;    // how the cells store K and V (in the disk tier's layout)
};

class llama_opt_kv_memory {
public:
    // Sets up placement on `mem` (aligned cells, the scratch sequence's parked rows keep their tiles,
    // the sliding-window view), the block pool (dedup_enabled) and the disk tier (persist_enabled).
    // Throws llama_opt_error when the memory cannot place cells aligned or the disk tier cannot open.
    // Evictions are counted in `stats`.
    llama_opt_kv_memory(llama_memory_t mem, const llama_opt_model & model, const llama_opt_kv_memory_params & params,
                        const llama_opt_config & cfg, llama_opt_stats & stats);

    llama_opt_kv_memory(const llama_opt_kv_memory &)             = delete;
    llama_opt_kv_memory & operator=(const llama_opt_kv_memory &) = delete;

    // Owners are told (on_kv_leaving, when there is a disk tier), the background writer is given
    // up to a minute to write what they queued and stopped, then every slot and the pool are
    // emptied; the llama memory is not used again. The caller frees it afterwards.
    void close();
    // llama_opt_error(session_closed) once closed.
    void check_open() const;

    // --- sequence slots (LRU) ---

    // A free sequence id for `owner` (a cached sequence is given up if none is free). Throws
    // llama_opt_error(context_overflow) when every sequence is taken by an open session.
    int32_t acquire_seq(std::weak_ptr<llama_opt_seq_owner> owner);
    // The owner is done with `seq`: its complete pooled blocks stay cached for reuse (dedup on),
    // the rest of its KV is freed. Nothing happens if `seq` was evicted and is someone else's now.
    void    release_seq(int32_t seq, const llama_opt_seq_owner * owner, bool keep_blocks = true);
    // `seq` is used now (LRU order).
    void    touch(int32_t seq);
    // Frees the least recently used cached sequence (or, unless cached_only, idle session)
    // other than `except` (and with `above`, holding a cell at or above that index); false if there is none.
    bool    evict_one(int32_t except, bool cached_only = false, size_t above = 0);
    uint32_t n_sessions() const;  // open sessions
    uint32_t n_cached() const;    // closed sessions whose blocks are kept for reuse
    uint32_t cells_used() const;  // 0 once closed
    // A sequence id no session uses: KV parked there while a session is rearranged (Tier-2 sync).
    int32_t  scratch_seq() const { return (int32_t) params_.n_seq; }

    // --- the KV of a sequence ---

    // Removes the KV of positions >= pos. Inside the prefix whose cells other sequences may
    // hold too, the cut moves down to a block boundary (a shared tile is never written), and
    // pooled blocks from there on are let go. Returns where the sequence's KV now ends.
    size_t truncate(int32_t seq, size_t pos);
    // Removes the KV of [p0, p1) (p1 < 0: to the end) without any bookkeeping: cells no block
    // or shared prefix covers (unconfirmed drafts, the scratch sequence, a failed computation).
    void   remove(int32_t seq, llama_pos p0, llama_pos p1);
    // Tier 2: the KV of [p0, p1) leaves the sequence (a hole; the positions of the rest stay),
    // and so do its pooled blocks from the one p0 is in.
    void   drop(int32_t seq, size_t p0, size_t p1);
    // `dst` takes `src`'s cells of [p0, p1): stored once, held by both.
    void   share(int32_t src, int32_t dst, size_t p0, size_t p1);
    int32_t cell(int32_t seq, size_t pos) const;  // the cell holding a position, -1 if none (patches/0004)
    size_t end(int32_t seq) const;  // one past the last position of the sequence in the KV memory
    size_t top(int32_t seq) const;  // one past the sequence's highest cell (canonical placement), 0 if none
    // Sliding-window layers attend over the cache from the window's first cell (patches/0013; on in
    // a canonical context): the same bits, less work at long contexts. Off: llama.cpp's whole-cache
    // view, for tests and measurements.
    void   set_swa_view(bool on);

    // --- room (canonical placement) ---

    // Room for the history of `seq` to grow from n_old to n_new tokens: its new blocks go into empty
    // tiles above its highest one (all of the cache's, for a sequence without KV). Frees cached
    // sequences holding cells up there (and, with evict_sessions, then idle sessions), least recently
    // used first, until there is room; false if there is none even then. Nothing is computed, so a
    // caller that checks first never throws work away.
    bool make_room(int32_t seq, size_t n_old, size_t n_new, bool evict_sessions);
    // Whether an empty tile lies above the highest one of `seq` (its history can start one more).
    bool tile_above(int32_t seq) const;
    // Whether `seq`, its KV dropped, would find room for n_new tokens computed again from the bottom:
    // the empty tiles and its own that no other sequence shares, cached sequences then idle sessions
    // evicted (least recently used first) until they are enough. `seq` itself is not touched.
    bool room_after_drop(int32_t seq, size_t n_new);
    // The error of a full KV cache (context_overflow), with what to do.
    llama_opt_error full_error() const;

    // --- Tier-2 sync: rearranging a sequence in its own cells ---

    // Tier-2 sync rebuilds a history in position order around the unchanged spans after an edit,
    // without room for a second copy of them, in two steps around the history's cut at `keep`.
    // park checks that the KV of `seq` can be rearranged in its own cells for a history going from
    // n_old to n_new tokens (its positions >= keep the sequence's alone, room above its cells for the
    // growth; cached sequences sharing those cells or taking that room are evicted), then moves each
    // span's KV to its new positions (patches/0005), parked on the scratch sequence, whose rows
    // reserve their tiles (patches/0008). Unless it returns possible, nothing is parked. unpark
    // gives every parked span to `seq` (its cells past keep cut by then) and empties the scratch sequence.
    llama_opt_in_place park(int32_t seq, size_t keep, size_t n_old, size_t n_new,
                            const std::vector<llama_opt_span_move> & moves);
    void unpark(int32_t seq);

    // --- rows (the disk tier's format) ---

    // The KV rows of [p0, p1) as the disk tier stores them; false if some are not in the cache.
    bool read(int32_t seq, size_t p0, size_t p1, uint8_t * rows) const;
    // Writes rows read by read() into [p0, p1), evicting cached sequences for room (and idle
    // sessions with `evict_sessions`, as computing those rows would); false: no room.
    bool write(int32_t seq, size_t p0, size_t p1, const uint8_t * rows, bool evict_sessions = false);

    // --- the block pool (dedup) and the disk tier ---

    bool                          dedup() const { return pool_ != nullptr; }
    llama_opt_block_pool *        pool() { return pool_.get(); }
    const std::vector<uint64_t> & held_blocks(int32_t seq) const { return slots_[seq].blocks; }
    // `seq` holds `block` as its next block (its cells hold the block's KV).
    void hold_block(int32_t seq, const llama_opt_kv_block * block);
    // pool()->insert, freeing cached sequences for room if the pool is full; nullptr if none can go.
    const llama_opt_kv_block * pool_insert(int32_t seq, uint64_t hash, uint64_t parent, uint32_t index,
                                           const llama_token * tokens);
    // Chained hash of one block (kv/block-hash), masked by the test hook below.
    uint64_t block_hash(uint64_t parent, const llama_token * block) const;
    // Test hook: keep only these bits of every block hash, to force collisions. Lookups are
    // verified (tokens and parent block), so this must never change a result.
    void set_test_hash_mask(uint64_t mask) { hash_mask_ = mask; }
    // kv-cache-persist: the disk tier, if persist_enabled (else null), and what its entries must match
    llama_opt_persist_store *        persist() const { return persist_.get(); }
    const llama_opt_persist_layout & persist_layout() const { return persist_layout_; }
    // its background writer (kv/disk-writer), if persist_write_behind too (else null); it lives
    // until the memory does, stopped by close() after a bounded flush
    llama_opt_persist_write_behind * write_behind() const { return write_behind_.get(); }

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

    size_t tiles(size_t n) const { return (n + params_.align - 1) / params_.align; }
    // Frees the least recently used cached sequence that alone holds a pooled block, so that
    // the pool gets room; false if there is none.
    bool evict_for_pool(int32_t except);
    // park's first step: whether `seq` can be rearranged in place (cached sharers and room made)
    llama_opt_in_place prepare_in_place(int32_t seq, size_t keep, size_t n_old, size_t n_new);
    void release_blocks(int32_t seq, size_t keep);  // lets go of the pooled blocks from `keep` on
    void drop_sequence(int32_t seq);                // frees a sequence's KV, pool references and id
    void open_persist_store(const llama_opt_model & model, const llama_opt_config & cfg);

    llama_memory_t                           mem_;  // null once closed
    llama_opt_kv_memory_params               params_;
    llama_opt_stats &                        stats_;
    std::unique_ptr<llama_opt_block_pool>    pool_;
    std::unique_ptr<llama_opt_persist_store> persist_;
    std::unique_ptr<llama_opt_persist_write_behind> write_behind_;  // (after persist_: stopped before it goes)
    llama_opt_persist_layout                 persist_layout_;
    std::vector<slot>                        slots_;  // by sequence id
    uint64_t                                 clock_     = 0;  // for LRU
    uint64_t                                 hash_mask_ = ~0ULL;
};
