#include "kv/memory.h"

#include "kv/block-hash.h"
#include "kv/disk-dir.h"
#include "base/checksum.h"
#include "kv/file-hash.h"
#include "engine/log.h"

#include <algorithm>
#include <cstdlib>

// how long closing waits for the background writer before dropping what is still queued
static constexpr double CLOSE_FLUSH_S = 60;

llama_opt_kv_memory::llama_opt_kv_memory(llama_memory_t mem, const llama_opt_model & model,
                                         const llama_opt_kv_memory_params & params, const llama_opt_config & cfg,
                                         llama_opt_stats & stats)
    : mem_(mem), params_(params), stats_(stats) {
    if (params.canonical && !llama_memory_set_cell_align(mem_, params.align)) {
        throw llama_opt_error(llama_opt_errc::invalid_argument,
            "this model's KV memory does not support aligned placement; use schedule='llama'", "schedule");
    }
    llama_memory_set_park_seq(mem_, scratch_seq());  // Tier-2 sync's parked rows keep their tiles
    set_swa_view(params.canonical);
    if (cfg.dedup_enabled) {
        pool_ = std::make_unique<llama_opt_block_pool>(cfg.dedup_pool_max);
    }
    if (cfg.persist_enabled) {
        open_persist_store(model, cfg);
    }
    slots_.resize(params.n_seq);
}

// A quantized cache's types (in the compat hash too, which names entry files: entries of two pairs
// of types for the same tokens live side by side; "q8_0" for K and V alike, as before K and V could
// differ, "f16/q8_0" when they do), and what else decides the bits of its quantized rows:
// llama.cpp rotates them (a Hadamard transform) before quantizing unless LLAMA_ATTN_ROT_DISABLE
// is set when the cache is made. ("" for F16: the identity of F16 entries stays what it was.)
static std::string quantized_kv_compat(const llama_opt_kv_codec & codec) {
    if (codec.identity()) {
        return "";
    }
    const char * rot_disable = std::getenv("LLAMA_ATTN_ROT_DISABLE");  // (read as llama.cpp reads it)
    return "|kv_type=" + codec.name() + "|kv_rot=" + std::string(rot_disable && std::atoi(rot_disable) ? "0" : "1");
}

void llama_opt_kv_memory::open_persist_store(const llama_opt_model & model, const llama_opt_config & cfg) {
    const size_t row = llama_memory_kv_bytes_per_pos(mem_);
    if (row == 0) {
        throw llama_opt_error(llama_opt_errc::config,
            "the persistent KV cache needs flash_attn=True (without it llama.cpp stores V transposed)", "flash_attn");
    }
    // what decides the KV bits besides model and tokens: the build (pin, patches, CPU flags)
    // and this context's numerics settings
    const std::string compat = std::string(LLAMA_OPT_BUILD_ID) + "|" + llama_print_system_info() +
        "|fa=" + std::to_string(params_.flash_attn) + "|swa_full=" + std::to_string(params_.swa_full) +
        "|align=" + std::to_string(params_.align) + "|row_align=" + std::to_string(params_.row_align) +
        quantized_kv_compat(params_.codec);
    const std::string dir  = cfg.persist_dir.empty() ? llama_opt_persist_default_dir() : cfg.persist_dir;
    const auto        dims = model.head_dims();
    std::string       why;
    if (!llama_opt_persist_prepare_dir(dir, why)) {  // said now, not at the first save
        throw llama_opt_error(llama_opt_errc::config, "persist_dir: " + why, "persist_dir");
    }
    try {
        persist_layout_.model_hash = llama_opt_file_hash(model.path(), dir, model.file_stat());
    } catch (const std::exception & e) {
        throw llama_opt_error(llama_opt_errc::model_load, std::string(e.what()) + " (the persistent KV cache names "
                              "stored KV by the model file's content)");
    }
    persist_layout_.compat_hash     = llama_opt_checksum(compat.data(), compat.size());
    persist_layout_.block_size      = params_.block;
    persist_layout_.n_layers        = (uint32_t) model.n_layer();
    persist_layout_.n_kv_heads      = (uint32_t) model.n_head_kv();
    persist_layout_.k_dim           = dims.first;
    persist_layout_.v_dim           = dims.second;
    persist_layout_.k_type          = params_.codec.k.type;  // an entry of other types is never restored
    persist_layout_.v_type          = params_.codec.v.type;
    persist_layout_.bytes_per_token = row;
    persist_ = std::make_unique<llama_opt_persist_store>(dir);
    if (cfg.persist_write_behind) {
        write_behind_ = std::make_unique<llama_opt_persist_write_behind>(
            *persist_, persist_layout_, (uint64_t) cfg.persist_queue_mb << 20, (uint64_t) cfg.persist_max_mb << 20,
            std::chrono::milliseconds(cfg.persist_flush_ms), [](const std::string & warning) { llama_opt_log_warn(warning); });
    }
}

void llama_opt_kv_memory::close() {
    if (mem_ && persist_) {
        for (auto & s : slots_) {
            if (auto owner = s.owner.lock()) {
                owner->on_kv_leaving();
            }
        }
    }
    if (write_behind_) {
        write_behind_->flush(CLOSE_FLUSH_S);  // a server's drain: what its sessions computed reaches the disk
        write_behind_->stop();
    }
    slots_.assign(slots_.size(), slot());
    pool_.reset();
    mem_ = nullptr;
}

void llama_opt_kv_memory::check_open() const {
    if (!mem_) {
        throw llama_opt_error(llama_opt_errc::session_closed, "the context is closed; create a new Context");
    }
}

// --- sequence slots (LRU) ---

int32_t llama_opt_kv_memory::acquire_seq(std::weak_ptr<llama_opt_seq_owner> owner) {
    check_open();
    auto pick = [&]() -> int32_t {
        for (size_t seq = 0; seq < slots_.size(); ++seq) {
            if (slots_[seq].state == slot_state::free) {
                return (int32_t) seq;
            }
        }
        // no free sequence: give up the least recently used cached one
        int32_t oldest = -1;
        for (size_t seq = 0; seq < slots_.size(); ++seq) {
            if (slots_[seq].state == slot_state::cached && (oldest < 0 || slots_[seq].last_use < slots_[oldest].last_use)) {
                oldest = (int32_t) seq;
            }
        }
        if (oldest >= 0) {
            drop_sequence(oldest);
            stats_.dedup_sequences_evicted += 1;
        }
        return oldest;
    };
    const int32_t seq = pick();
    if (seq < 0) {
        throw llama_opt_error(llama_opt_errc::context_overflow,
            "all " + std::to_string(slots_.size()) + " session slots of this context are in use; close a session "
            "or create the Context with a larger n_seq_max", "n_seq_max");
    }
    slots_[seq].state    = slot_state::session;
    slots_[seq].owner_id = owner.lock().get();
    slots_[seq].owner    = std::move(owner);
    touch(seq);
    return seq;
}

void llama_opt_kv_memory::release_seq(int32_t seq, const llama_opt_seq_owner * owner, bool keep_blocks) {
    slot & sl = slots_[seq];
    if (mem_ == nullptr || sl.owner_id != owner) {
        return;  // evicted while it was closing: the slot is someone else's now
    }
    if (keep_blocks && pool_ && !sl.blocks.empty()) {
        truncate(seq, sl.blocks.size() * params_.block);  // keep the pooled complete blocks only
        sl.state = slot_state::cached;
        sl.owner.reset();
        sl.owner_id = nullptr;
        return;
    }
    drop_sequence(seq);
}

uint32_t llama_opt_kv_memory::n_sessions() const {
    return (uint32_t) std::count_if(slots_.begin(), slots_.end(), [](const slot & s) { return s.state == slot_state::session; });
}

uint32_t llama_opt_kv_memory::n_cached() const {
    return (uint32_t) std::count_if(slots_.begin(), slots_.end(), [](const slot & s) { return s.state == slot_state::cached; });
}

uint32_t llama_opt_kv_memory::cells_used() const {
    return mem_ ? (uint32_t) llama_memory_cells_used(mem_) : 0;
}

void llama_opt_kv_memory::touch(int32_t seq) {
    slots_[seq].last_use = ++clock_;
    if (pool_) {
        pool_->next_turn();
    }
}

void llama_opt_kv_memory::release_blocks(int32_t seq, size_t keep) {
    std::vector<uint64_t> & blocks = slots_[seq].blocks;
    if (pool_) {
        for (size_t k = keep; k < blocks.size(); ++k) {
            if (const auto * b = pool_->find(blocks[k])) {
                pool_->unref(b, seq);
            }
        }
    }
    blocks.resize(std::min(blocks.size(), keep));
}

void llama_opt_kv_memory::drop_sequence(int32_t seq) {
    if (mem_) {
        llama_memory_seq_rm(mem_, seq, -1, -1);
    }
    release_blocks(seq, 0);
    slots_[seq] = slot();
}

bool llama_opt_kv_memory::evict_one(int32_t except, bool cached_only, size_t above) {
    // cached sequences first, then idle sessions; least recently used first
    int32_t victim = -1;
    for (const slot_state state : { slot_state::cached, slot_state::session }) {
        if (state == slot_state::session && cached_only) {
            break;
        }
        for (size_t seq = 0; seq < slots_.size(); ++seq) {
            const slot & s = slots_[seq];
            const std::shared_ptr<llama_opt_seq_owner> owner = s.owner.lock();
            const bool alive = state == slot_state::cached || (owner && !owner->in_use());
            if ((int32_t) seq != except && s.state == state && alive && (victim < 0 || s.last_use < slots_[victim].last_use) &&
                (above == 0 || top((int32_t) seq) > above)) {
                victim = (int32_t) seq;
            }
        }
        if (victim >= 0) {
            break;
        }
    }
    if (victim < 0) {
        return false;
    }
    if (slots_[victim].state == slot_state::cached) {
        drop_sequence(victim);
        stats_.dedup_sequences_evicted += 1;
    } else {
        // the slot's owner is alive: an owner being destroyed waits for our lock in its close()
        // and is never chosen (lock() fails)
        std::shared_ptr<llama_opt_seq_owner> owner = slots_[victim].owner.lock();
        if (persist_) {
            owner->on_kv_leaving();  // an evicted session stays restorable from disk
        }
        drop_sequence(victim);
        owner->on_evicted();
        stats_.sessions_evicted += 1;
    }
    return true;
}

bool llama_opt_kv_memory::evict_for_pool(int32_t except) {
    int32_t victim = -1;
    for (size_t seq = 0; seq < slots_.size(); ++seq) {
        const slot & s = slots_[seq];
        if ((int32_t) seq == except || s.state != slot_state::cached || (victim >= 0 && s.last_use >= slots_[victim].last_use)) {
            continue;
        }
        const bool frees = std::any_of(s.blocks.begin(), s.blocks.end(), [&](uint64_t id) {
            const llama_opt_kv_block * b = pool_->find(id);
            return b && b->holders.size() == 1;
        });
        if (frees) {
            victim = (int32_t) seq;
        }
    }
    if (victim < 0) {
        return false;
    }
    drop_sequence(victim);
    stats_.dedup_sequences_evicted += 1;
    return true;
}

// --- the block pool (dedup) ---

void llama_opt_kv_memory::hold_block(int32_t seq, const llama_opt_kv_block * block) {
    pool_->ref(block, seq);
    slots_[seq].blocks.push_back(block->id);
}

const llama_opt_kv_block * llama_opt_kv_memory::pool_insert(int32_t seq, uint64_t hash, uint64_t parent,
                                                            uint32_t index, const llama_token * tokens) {
    const llama_opt_kv_block * b = pool_->insert(hash, parent, index, tokens, params_.block);
    while (!b && evict_for_pool(seq)) {
        b = pool_->insert(hash, parent, index, tokens, params_.block);
    }
    return b;
}

uint64_t llama_opt_kv_memory::block_hash(uint64_t parent, const llama_token * block) const {
    return llama_opt_hash_chain(parent, block, params_.block) & hash_mask_;
}
