// llama_opt_kv_memory's cell operations (kv/memory.h): cuts and sharing with their
// bookkeeping, room under canonical placement, Tier-2 sync's parked rows, and row read/write.
// Canonical placement (patches/0001): a sequence's cells start at a multiple of the tile
// (params.align) and are in position order, so its highest cell is that of its last position.

#include "kv/memory.h"

#include <algorithm>

// --- the KV of a sequence ---

size_t llama_opt_kv_memory::truncate(int32_t seq, size_t pos) {
    slot & sl = slots_[seq];
    if (pos < sl.n_shared) {
        pos         = pos / params_.block * params_.block;
        sl.n_shared = pos;
    }
    llama_memory_seq_rm(mem_, seq, (llama_pos) pos, -1);
    release_blocks(seq, params_.canonical ? pos / params_.block : 0);  // complete blocks below pos stay
    return pos;
}

void llama_opt_kv_memory::remove(int32_t seq, llama_pos p0, llama_pos p1) {
    llama_memory_seq_rm(mem_, seq, p0, p1);
}

void llama_opt_kv_memory::drop(int32_t seq, size_t p0, size_t p1) {
    llama_memory_seq_rm(mem_, seq, (llama_pos) p0, (llama_pos) p1);
    release_blocks(seq, p0 / params_.block);
}

void llama_opt_kv_memory::share(int32_t src, int32_t dst, size_t p0, size_t p1) {
    llama_memory_seq_cp(mem_, src, dst, (llama_pos) p0, (llama_pos) p1);
    slots_[dst].n_shared = std::max(slots_[dst].n_shared, p1);
    if (slots_[src].state == slot_state::session) {  // cached sequences never write again
        slots_[src].n_shared = std::max(slots_[src].n_shared, p1);
    }
}

int32_t llama_opt_kv_memory::cell(int32_t seq, size_t pos) const {
    return llama_memory_seq_cell(mem_, seq, (llama_pos) pos);
}

size_t llama_opt_kv_memory::end(int32_t seq) const {
    return (size_t) (llama_memory_seq_pos_max(mem_, seq) + 1);  // -1: none
}

size_t llama_opt_kv_memory::top(int32_t seq) const {
    const size_t last = end(seq);
    return last == 0 ? 0 : (size_t) cell(seq, last - 1) + 1;  // cells are in position order
}

void llama_opt_kv_memory::set_swa_view(bool on) {
    llama_memory_set_swa_view(mem_, on);  // false: a model without sliding-window layers
}

// --- room ---

bool llama_opt_kv_memory::make_room(int32_t seq, size_t n_old, size_t n_new, bool evict_sessions) {
    const size_t grow = tiles(n_new) > tiles(n_old) ? tiles(n_new) - tiles(n_old) : 0;
    if (grow == 0) {
        return true;  // (every decode step asks: the tiles are not counted when none is new)
    }
    while (llama_memory_seq_tiles_free_above(mem_, seq) < grow) {
        // only KV above the sequence's highest tile is in the way (all of it, for a sequence without KV)
        const size_t highest = top(seq);
        if (!evict_one(seq, !evict_sessions, highest == 0 ? 0 : tiles(highest) * params_.align)) {
            return false;
        }
    }
    return true;
}

bool llama_opt_kv_memory::tile_above(int32_t seq) const {
    return llama_memory_seq_tiles_free_above(mem_, seq) > 0;
}

bool llama_opt_kv_memory::room_after_drop(int32_t seq, size_t n_new) {
    const uint32_t n_tiles = params_.n_ctx / params_.align;
    // nothing is evicted unless it can be enough: the tiles no other sequence in use holds a cell in
    std::vector<char> held(n_tiles + 1, 0);
    for (size_t s = 0; s < slots_.size(); ++s) {
        const std::shared_ptr<llama_opt_seq_owner> owner = slots_[s].owner.lock();
        if ((int32_t) s != seq && slots_[s].state == slot_state::session && owner && owner->in_use()) {
            for (size_t p = 0, last = end((int32_t) s); p < last; ++p) {
                const int32_t c = cell((int32_t) s, p);
                if (c >= 0) {
                    held[(size_t) c / params_.align] = 1;
                }
            }
        }
    }
    if ((size_t) std::count(held.begin(), held.begin() + n_tiles, 0) < tiles(n_new)) {
        return false;
    }
    auto room = [&] {  // (the scratch sequence holds no cells outside a Tier-2 move: all empty tiles)
        const size_t own = tiles(end(seq)) - tiles((size_t) llama_memory_seq_shared_end(mem_, seq));
        return (size_t) llama_memory_seq_tiles_free_above(mem_, scratch_seq()) + own;
    };
    while (room() < tiles(n_new)) {
        if (!evict_one(seq)) {
            return false;
        }
    }
    return true;
}

llama_opt_error llama_opt_kv_memory::full_error() const {
    return llama_opt_error(llama_opt_errc::context_overflow,
        "the KV cache is full (" + std::to_string(params_.n_ctx) + " cells shared by all sessions of this context); "
        "close other sessions or create the Context with a larger n_ctx", "n_ctx");
}

// --- Tier-2 sync ---

llama_opt_in_place llama_opt_kv_memory::prepare_in_place(int32_t seq, size_t keep, size_t n_old, size_t n_new) {
    if (!params_.canonical || llama_memory_kv_bytes_per_pos(mem_) == 0) {
        return llama_opt_in_place::unsupported;
    }
    // rows are written where the sequence's own rows are: past the edit they must be its alone
    for (size_t shared_end; (shared_end = (size_t) llama_memory_seq_shared_end(mem_, seq)) > keep;) {
        const int32_t c      = cell(seq, shared_end - 1);
        int32_t       holder = -1;
        for (size_t s = 0; s < slots_.size() && holder < 0; ++s) {
            if (slots_[s].state == slot_state::cached && cell((int32_t) s, shared_end - 1) == c) {
                holder = (int32_t) s;
            }
        }
        if (holder < 0) {
            return llama_opt_in_place::shared;  // an open session's: it stays as it is
        }
        drop_sequence(holder);
        stats_.dedup_sequences_evicted += 1;
    }
    slots_[seq].n_shared = std::min(slots_[seq].n_shared, (size_t) llama_memory_seq_shared_end(mem_, seq));
    // blocks past the sequence's last tile go above it, as a computation would place them
    return make_room(seq, n_old, n_new, /* evict_sessions */ false) ? llama_opt_in_place::possible
                                                                    : llama_opt_in_place::no_room;
}

// The order to park spans in: their rows move within the sequence's own cells (like memmove), so
// a span whose new place overlaps where another span still is waits for it. Spans keep their
// order, so the waits form no cycle (a span reaching right into the next one's place while that
// one reaches left into its own would need their new places to cross).
static std::vector<llama_opt_span_move> parking_order(std::vector<llama_opt_span_move> moves) {
    std::vector<llama_opt_span_move> order;
    while (!moves.empty()) {
        const auto next = std::find_if(moves.begin(), moves.end(), [&](const llama_opt_span_move & m) {
            return std::none_of(moves.begin(), moves.end(), [&](const llama_opt_span_move & other) {
                return &other != &m && m.to < other.from + other.n && other.from < m.to + m.n;
            });
        });
        order.push_back(*next);
        moves.erase(next);
    }
    return order;
}

llama_opt_in_place llama_opt_kv_memory::park(int32_t seq, size_t keep, size_t n_old, size_t n_new,
                                             const std::vector<llama_opt_span_move> & moves) {
    const llama_opt_in_place in_place = prepare_in_place(seq, keep, n_old, n_new);
    if (in_place != llama_opt_in_place::possible) {
        return in_place;
    }
    for (const llama_opt_span_move & m : parking_order(moves)) {
        if (!llama_memory_seq_move(mem_, seq, scratch_seq(), (llama_pos) m.from, (llama_pos) (m.from + m.n),
                                   (llama_pos) m.to - (llama_pos) m.from)) {
            llama_memory_seq_rm(mem_, scratch_seq(), -1, -1);  // not expected once prepared
            return llama_opt_in_place::no_room;
        }
    }
    return llama_opt_in_place::possible;
}

void llama_opt_kv_memory::unpark(int32_t seq) {
    llama_memory_seq_cp(mem_, scratch_seq(), seq, -1, -1);  // the same cells, no copy
    llama_memory_seq_rm(mem_, scratch_seq(), -1, -1);
}

// --- rows ---

bool llama_opt_kv_memory::read(int32_t seq, size_t p0, size_t p1, uint8_t * rows) const {
    return llama_memory_seq_kv_read(mem_, seq, (llama_pos) p0, (llama_pos) p1, rows);
}

bool llama_opt_kv_memory::write(int32_t seq, size_t p0, size_t p1, const uint8_t * rows, bool evict_sessions) {
    bool written = llama_memory_seq_kv_write(mem_, seq, (llama_pos) p0, (llama_pos) p1, rows);
    while (!written && evict_one(seq, /* cached_only */ !evict_sessions)) {
        written = llama_memory_seq_kv_write(mem_, seq, (llama_pos) p0, (llama_pos) p1, rows);
    }
    return written;
}
