#include "llama-opt-context.h"

#include "llama-context-hash.h"
#include "llama-h2o.h"
#include "llama-kv-cache-persist-dir.h"
#include "llama-opt-checksum.h"
#include "llama-opt-file-hash.h"
#include "llama-opt-log.h"
#include "llama.h"

#include <algorithm>
#include <chrono>
#include <thread>

// Measured on this build (tests/integration/test_numerics.py): with flash attention, rows
// computed in a chunk of fewer than 64 tokens differ from the same rows in a larger chunk, and
// a sequence's cells must start at multiples of 64 for its logits not to depend on other
// sequences' cells; without flash attention, 16 is enough for both. Either way chunk
// boundaries must be multiples of 4 (row_align()).
static uint32_t numerics_granularity(bool flash_attn) {
    return flash_attn ? LLAMA_OPT_FA_KV_TILE : 16;
}

llama_opt_context::llama_opt_context(std::shared_ptr<llama_opt_model> model, const llama_opt_context_params & params,
                                     const llama_opt_settings & settings)
    : model_(std::move(model)), params_(params), settings_(settings) {
    auto invalid = [](const std::string & msg, const char * name) {
        throw llama_opt_error(llama_opt_errc::invalid_argument, msg, name);
    };
    if (params.n_ctx < 16) {
        invalid("n_ctx must be at least 16 (got " + std::to_string(params.n_ctx) + ")", "n_ctx");
    }
    if (params.n_batch < 1) {
        invalid("n_batch must be at least 1", "n_batch");
    }
    if (params.n_seq_max < 1 || params.n_seq_max > 255) {  // llama.cpp's 256, one kept for scratch_seq()
        invalid("n_seq_max must be between 1 and 255 (got " + std::to_string(params.n_seq_max) + ")", "n_seq_max");
    }
    if (params.n_threads < 0 || params.n_threads_batch < 0) {
        invalid("n_threads must be positive, or 0 for all hardware threads", "n_threads");
    }

    const llama_opt_config & cfg = settings_.config;
    block_ = cfg.block_size;
    if (params.canonical) {
        align_ = numerics_granularity(params.flash_attn);
        if (block_ % align_ != 0) {
            throw llama_opt_error(llama_opt_errc::config,
                "block_size=" + std::to_string(block_) + " cannot be exact with flash_attn=" +
                (params.flash_attn ? "on" : "off") + " on this build: use a multiple of " + std::to_string(align_) +
                " (docs/exactness.md)", "block_size");
        }
        if (params.n_batch < block_) {
            invalid("n_batch (" + std::to_string(params.n_batch) + ") must be at least block_size (" +
                    std::to_string(block_) + ")", "n_batch");
        }
        chunk_ = params.n_batch / block_ * block_;
        if (!params.swa_full && model_->n_swa() > 0) {
            invalid("the canonical schedule needs swa_full=True on a sliding-window model", "swa_full");
        }
    } else if (cfg.dedup_enabled || cfg.diff_enabled || cfg.persist_enabled) {
        throw llama_opt_error(llama_opt_errc::config,
            "the llama schedule cannot reuse KV: turn dedup_enabled, diff_enabled and persist_enabled off, or use "
            "the canonical schedule", "schedule");
    }
    if (cfg.dedup_enabled) {
        pool_ = std::make_unique<llama_opt_block_pool>(cfg.dedup_pool_max);
    }

    const int32_t hw = (int32_t) std::max(1u, std::thread::hardware_concurrency());
    llama_context_params cp = llama_context_default_params();
    // llama.cpp pads n_ctx to a multiple of 256 but caps its batch at the n_ctx given: padded here, so
    // that a span of n_ctx() tokens (the most a session holds) fits one batch (a prompt between the two
    // overran the batch: a crash)
    cp.n_ctx           = (params.n_ctx + 255) / 256 * 256;
    // One ubatch per llama_decode call: we choose every chunk boundary ourselves.
    cp.n_batch         = params.canonical ? chunk_ + min_chunk() : params.n_batch;  // room for a merged remainder
    cp.n_ubatch        = cp.n_batch;
    cp.n_seq_max       = params.n_seq_max + 1;  // + scratch_seq()
    cp.n_threads       = params.n_threads > 0 ? params.n_threads : hw;
    cp.n_threads_batch = params.n_threads_batch > 0 ? params.n_threads_batch : cp.n_threads;
    cp.flash_attn_type = params.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.swa_full        = params.swa_full;
    cp.kv_unified      = true;  // sessions share the KV cells of a common prefix
    cp.no_perf         = true;
    // Tier 2: observe queries (set only then: exact mode computes in one graph)
    if (cfg.attn_prune_enabled || (cfg.spec_prefill_enabled && cfg.spec_prefill_draft_model.empty())) {
        attn_capture_    = std::make_unique<llama_opt_attn_capture>(model_->get(), cfg.attn_prune_queries);
        cp.cb_eval           = &llama_opt_attn_capture::callback;
        cp.cb_eval_user_data = attn_capture_.get();
    }
    if (cfg.h2o_enabled) {  // Tier 2: observe the H2O chunks' softmax weights
        h2o_capture_ = std::make_unique<llama_opt_h2o_capture>(model_->get());
        check_h2o_settings(cp.n_batch);
        cp.cb_eval           = &llama_opt_h2o_capture::callback;
        cp.cb_eval_user_data = h2o_capture_.get();
    }
    if (params.profile != llama_opt_profile_mode::none) {  // a diagnostic: every node computed alone
        if (attn_capture_ || h2o_capture_) {
            invalid("an operation profile cannot be taken with attn_prune_enabled, spec_prefill_enabled or "
                    "h2o_enabled (each needs the eval callback)", "profile");
        }
        op_profile_          = std::make_unique<llama_opt_op_profile>(params.profile);
        cp.cb_eval           = &llama_opt_op_profile::callback;
        cp.cb_eval_user_data = op_profile_.get();
    }

    llama_opt_log_take_errors();
    ctx_ = llama_init_from_model(model_->get(), cp);
    if (!ctx_) {
        const std::string why = llama_opt_log_take_errors();
        throw llama_opt_error(llama_opt_errc::invalid_argument,
            "llama.cpp could not create the context" + (why.empty() ? "" : ":\n" + why) +
            "\nTry a smaller n_ctx (memory) or other parameters.", "n_ctx");
    }
    n_ctx_ = llama_n_ctx(ctx_);
    if (params.canonical && !llama_memory_set_cell_align(llama_get_memory(ctx_), align_)) {
        llama_free(ctx_);
        ctx_ = nullptr;
        throw llama_opt_error(llama_opt_errc::invalid_argument,
            "this model's KV memory does not support aligned placement; use schedule='llama'", "schedule");
    }
    if (attn_capture_) {
        attn_capture_->check_layout(llama_memory_kv_bytes_per_pos(llama_get_memory(ctx_)));
    }
    if (cfg.spec_prefill_enabled && !cfg.spec_prefill_draft_model.empty()) {
        try {
            spec_draft_ = std::make_unique<llama_opt_spec_draft>(cfg.spec_prefill_draft_model, *model_, n_ctx_,
                                                                 params.n_batch, cp.n_threads);
        } catch (...) {
            llama_free(ctx_);
            ctx_ = nullptr;
            throw;
        }
    }
    llama_memory_set_park_seq(llama_get_memory(ctx_), scratch_seq());  // Tier-2 sync's parked rows keep their tiles
    set_swa_view(params.canonical);
    if (cfg.persist_enabled) {
        open_persist_store();
    }
    slots_.resize(params.n_seq_max);
}

void llama_opt_context::check_h2o_settings(uint32_t n_batch) const {
    const llama_opt_config & cfg = settings_.config;
    llama_h2o_params p;
    p.local_window = cfg.h2o_local_window, p.heavy_budget = cfg.h2o_heavy_budget, p.chunk_size = cfg.h2o_chunk_size;
    const std::string why = llama_h2o_check_params(p);
    if (!why.empty()) {
        throw llama_opt_error(llama_opt_errc::config, why, "h2o_chunk_size");
    }
    if (p.chunk_size > n_batch) {
        throw llama_opt_error(llama_opt_errc::config,
            "h2o_chunk_size (" + std::to_string(p.chunk_size) + ") must fit one llama_decode call of this context (" +
            std::to_string(n_batch) + " tokens): raise n_batch or lower LLAMA_OPT_H2O_CHUNK_SIZE", "h2o_chunk_size");
    }
    if (attn_capture_) {
        throw llama_opt_error(llama_opt_errc::config,
            std::string("h2o_enabled and ") + (cfg.attn_prune_enabled ? "attn_prune_enabled" : "spec_prefill_enabled") +
            " cannot share a context yet (both observe the graph): turn one off", "h2o_enabled");
    }
    if (!params_.flash_attn) {
        throw llama_opt_error(llama_opt_errc::config,
            "H2O gathers K and V rows from the cache, which needs flash_attn=True (without it llama.cpp stores V "
            "transposed)", "flash_attn");
    }
    if (h2o_capture_->layers().empty()) {
        throw llama_opt_error(llama_opt_errc::config,
            "this model has no full-attention layer (every layer slides): H2O has nothing to do; turn h2o_enabled off",
            "h2o_enabled");
    }
}

void llama_opt_context::open_persist_store() {
    const llama_opt_config & cfg = settings_.config;
    const size_t row = llama_memory_kv_bytes_per_pos(llama_get_memory(ctx_));
    if (row == 0) {
        llama_free(ctx_);
        ctx_ = nullptr;
        throw llama_opt_error(llama_opt_errc::config,
            "the persistent KV cache needs flash_attn=True (without it llama.cpp stores V transposed)", "flash_attn");
    }
    // what decides the KV bits besides model and tokens: the build (pin, patches, CPU flags)
    // and this context's numerics settings
    const std::string compat = std::string(LLAMA_OPT_BUILD_ID) + "|" + llama_print_system_info() +
        "|fa=" + std::to_string(params_.flash_attn) + "|swa_full=" + std::to_string(params_.swa_full) +
        "|align=" + std::to_string(align_) + "|row_align=" + std::to_string(row_align());
    const std::string dir  = cfg.persist_dir.empty() ? llama_opt_persist_default_dir() : cfg.persist_dir;
    const auto        dims = model_->head_dims();
    std::string       why;
    if (!llama_opt_persist_prepare_dir(dir, why)) {  // said now, not at the first save
        llama_free(ctx_);
        ctx_ = nullptr;
        throw llama_opt_error(llama_opt_errc::config, "persist_dir: " + why, "persist_dir");
    }
    try {
        persist_layout_.model_hash = llama_opt_file_hash(model_->path(), dir, model_->file_stat());
    } catch (const std::exception & e) {
        llama_free(ctx_);
        ctx_ = nullptr;
        throw llama_opt_error(llama_opt_errc::model_load, std::string(e.what()) + " (the persistent KV cache names "
                              "stored KV by the model file's content)");
    }
    persist_layout_.compat_hash     = llama_opt_checksum(compat.data(), compat.size());
    persist_layout_.block_size      = block_;
    persist_layout_.n_layers        = (uint32_t) model_->n_layer();
    persist_layout_.n_kv_heads      = (uint32_t) model_->n_head_kv();
    persist_layout_.k_dim           = dims.first;
    persist_layout_.v_dim           = dims.second;
    persist_layout_.k_type          = GGML_TYPE_F16;  // llama.cpp's default KV type, which we keep
    persist_layout_.v_type          = GGML_TYPE_F16;
    persist_layout_.bytes_per_token = row;
    persist_ = std::make_unique<llama_opt_persist_store>(dir);
}

llama_opt_context::~llama_opt_context() {
    llama_free(ctx_);
}

void llama_opt_context::check_open() const {
    if (!ctx_) {
        throw llama_opt_error(llama_opt_errc::session_closed, "the context is closed; create a new Context");
    }
}

int32_t llama_opt_context::acquire_seq(std::weak_ptr<llama_opt_seq_owner> owner) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
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

void llama_opt_context::release_seq(int32_t seq, const llama_opt_seq_owner * owner, bool keep_blocks) {
    slot & sl = slots_[seq];
    if (ctx_ == nullptr || sl.owner_id != owner) {
        return;  // evicted while it was closing: the slot is someone else's now
    }
    if (keep_blocks && pool_ && !sl.blocks.empty()) {
        kv_truncate(seq, sl.blocks.size() * block_);  // keep the pooled complete blocks only
        sl.state = slot_state::cached;
        sl.owner.reset();
        sl.owner_id = nullptr;
        return;
    }
    drop_sequence(seq);
}

void llama_opt_context::close() {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    if (ctx_ && persist_) {
        for (auto & s : slots_) {
            if (auto owner = s.owner.lock()) {
                owner->on_kv_leaving();
            }
        }
    }
    slots_.assign(slots_.size(), slot());
    pool_.reset();
    memo_outputs_.clear();
    llama_free(ctx_);
    ctx_ = nullptr;
}

uint32_t llama_opt_context::n_sessions() const {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    return (uint32_t) std::count_if(slots_.begin(), slots_.end(), [](const slot & s) { return s.state == slot_state::session; });
}

uint32_t llama_opt_context::n_cached() const {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    return (uint32_t) std::count_if(slots_.begin(), slots_.end(), [](const slot & s) { return s.state == slot_state::cached; });
}

uint32_t llama_opt_context::kv_cells_used() const {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    return ctx_ ? (uint32_t) llama_memory_cells_used(llama_get_memory(ctx_)) : 0;
}

llama_opt_stats llama_opt_context::stats() const {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    return stats_;
}

void llama_opt_context::reset_stats() {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    stats_.reset();
}

uint64_t llama_opt_context::block_hash(uint64_t parent, const llama_token * block) const {
    return llama_opt_hash_chain(parent, block, block_) & hash_mask_;
}

void llama_opt_context::touch(int32_t seq) {
    slots_[seq].last_use = ++clock_;
    if (pool_) {
        pool_->next_turn();
    }
}

void llama_opt_context::release_blocks(int32_t seq, size_t keep) {
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

void llama_opt_context::drop_sequence(int32_t seq) {
    if (ctx_) {
        llama_memory_seq_rm(llama_get_memory(ctx_), seq, -1, -1);
    }
    release_blocks(seq, 0);
    slots_[seq] = slot();
}

void llama_opt_context::set_swa_view(bool on) {
    llama_memory_set_swa_view(llama_get_memory(ctx_), on);  // false: a model without sliding-window layers
}

bool llama_opt_context::evict_one(int32_t except, bool cached_only, size_t above) {
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
                (above == 0 || kv_top((int32_t) seq) > above)) {
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

bool llama_opt_context::evict_for_pool(int32_t except) {
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

// A llama_batch of one sequence id per row, freed when it goes out of scope.
struct llama_opt_batch {
    llama_batch batch;
    int32_t     capacity;
    explicit llama_opt_batch(int32_t capacity) : batch(llama_batch_init(capacity, 0, 1)), capacity(capacity) {}
    ~llama_opt_batch() { llama_batch_free(batch); }
    llama_opt_batch(const llama_opt_batch &)             = delete;
    llama_opt_batch & operator=(const llama_opt_batch &) = delete;

    void set(int32_t i, int32_t seq, size_t pos, llama_token token, bool logits) {
        if (i >= capacity) {  // a bug, not bad input: an error rather than a write past the batch
            throw llama_opt_error(llama_opt_errc::decode_failed,
                "internal error: a batch of more than llama.cpp's n_batch (" + std::to_string(capacity) + ") tokens");
        }
        batch.token[i]     = token;
        batch.pos[i]       = (llama_pos) pos;
        batch.n_seq_id[i]  = 1;
        batch.seq_id[i][0] = seq;
        batch.logits[i]    = logits;
    }
};

void llama_opt_context::compute_span(int32_t seq, const llama_token * tokens, size_t begin, size_t end,
                                     std::vector<float> * logits, bool evict_sessions, llama_opt_work & work) {
    check_open();
    touch(seq);
    llama_opt_batch b((int32_t) llama_n_batch(ctx_));
    try {
        for (size_t pos = begin; pos < end;) {
            size_t stop = std::min(end, pos + params_.n_batch);
            if (params_.canonical) {
                stop = std::min(end, pos + chunk_);  // chunk_ is a multiple of row_align()
                if (end - stop < min_chunk()) {
                    stop = end;  // a remainder smaller than min_chunk() joins this chunk
                }
            }
            b.batch.n_tokens = (int32_t) (stop - pos);
            for (size_t p = pos; p < stop; ++p) {
                b.set((int32_t) (p - pos), seq, p, tokens[p], logits && p + 1 == end);
            }
            decode_chunk(seq, b.batch, evict_sessions, work);
            pos = stop;
        }
    } catch (...) {
        llama_memory_seq_rm(llama_get_memory(ctx_), seq, (llama_pos) begin, -1);  // no half-computed span stays
        throw;
    }
    if (logits) {
        const float * out = llama_get_logits_ith(ctx_, -1);
        logits->assign(out, out + model_->n_vocab());
    }
}

void llama_opt_context::compute_span_h2o(int32_t seq, const llama_token * tokens, size_t end,
                                         std::vector<float> * logits, llama_opt_work & work,
                                         llama_opt_h2o_work & h2o_work) {
    check_open();
    if (!h2o_capture_) {
        throw llama_opt_error(llama_opt_errc::feature_unavailable, "H2O prefill needs a context made with h2o_enabled");
    }
    touch(seq);
    using clock = std::chrono::steady_clock;
    auto us = [](clock::time_point since) {
        return (uint64_t) std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - since).count();
    };
    const llama_opt_config & cfg = settings_.config;
    llama_h2o_params p;
    p.local_window = cfg.h2o_local_window, p.heavy_budget = cfg.h2o_heavy_budget, p.chunk_size = cfg.h2o_chunk_size;
    const std::vector<int32_t> & layers = h2o_capture_->layers();
    llama_h2o                     state(p, (uint32_t) layers.size(), h2o_capture_->n_head(), (uint32_t) end);
    std::vector<llama_h2o_subset> subsets(layers.size());
    llama_opt_batch               b((int32_t) p.chunk_size);
    try {
        for (size_t pos = 0; pos < end;) {
            const size_t   stop = std::min(end, pos + p.chunk_size);
            const uint32_t n    = (uint32_t) (stop - pos);
            auto           t0   = clock::now();
            for (size_t i = 0; i < layers.size(); ++i) {
                state.subset((uint32_t) i, n, subsets[i]);
                if (!llama_set_attn_subset(ctx_, layers[i], (int32_t) h2o_capture_->n_head(), subsets[i].pos.data(),
                                           (int32_t) subsets[i].n_mem, (int32_t) n)) {
                    throw llama_opt_error(llama_opt_errc::decode_failed,
                                          "llama.cpp refused the attention subset of layer " + std::to_string(layers[i]));
                }
                h2o_work.tokens_kept += state.memory_count((uint32_t) i);
            }
            h2o_work.select_us += us(t0);

            b.batch.n_tokens = (int32_t) n;
            for (size_t q = pos; q < stop; ++q) {
                b.set((int32_t) (q - pos), seq, q, tokens[q], logits && q + 1 == end);
            }
            h2o_capture_->arm();
            decode_chunk(seq, b.batch, /* evict_sessions */ false, work);
            h2o_capture_->disarm();
            h2o_work.chunks += 1;

            t0 = clock::now();
            for (size_t i = 0; i < layers.size(); ++i) {
                const std::vector<float> & colsum = h2o_capture_->colsum(i);
                if (colsum.size() != (size_t) h2o_capture_->n_head() * subsets[i].n_keys()) {
                    throw llama_opt_error(llama_opt_errc::decode_failed,
                                          "the softmax weights of layer " + std::to_string(layers[i]) +
                                          " were not observed (is patches/0010 applied?)");
                }
                state.update_layer((uint32_t) i, subsets[i], colsum.data());
            }
            state.next_chunk(n);
            h2o_work.select_us += us(t0);
            pos = stop;
        }
    } catch (...) {
        h2o_capture_->disarm();
        llama_clear_attn_subsets(ctx_);
        llama_memory_seq_rm(llama_get_memory(ctx_), seq, 0, -1);  // no half-computed prompt stays
        throw;
    }
    llama_clear_attn_subsets(ctx_);
    if (logits) {
        const float * out = llama_get_logits_ith(ctx_, -1);
        logits->assign(out, out + model_->n_vocab());
    }
}

void llama_opt_context::decode_chunk(int32_t seq, const llama_batch & batch, bool evict_sessions, llama_opt_work & work) {
    if (decode_evicting(seq, batch, true, evict_sessions, work) != 0) {
        throw kv_full();
    }
    work.tokens += (uint64_t) batch.n_tokens;
    work.passes += 1;
}

int32_t llama_opt_context::decode_evicting(int32_t seq, const llama_batch & batch, bool evict, bool evict_sessions,
                                           llama_opt_work & work) {
    const auto t0     = std::chrono::steady_clock::now();
    auto       decode = [&] {
        if (attn_capture_) {
            attn_capture_->new_call();
        }
        return llama_decode(ctx_, batch);
    };
    int32_t rc = decode();
    while (rc == 1 && evict && evict_one(seq, !evict_sessions)) {  // no room: free the least recently used KV, retry
        rc = decode();
    }
    work.us += (uint64_t) std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
    if (rc != 0 && rc != 1) {
        const std::string why = llama_opt_log_take_errors();
        throw llama_opt_error(llama_opt_errc::decode_failed,
            "llama_decode failed with code " + std::to_string(rc) + (why.empty() ? "" : ":\n" + why));
    }
    return rc;
}

void llama_opt_context::compute_positions(int32_t seq, const llama_token * tokens, const std::vector<size_t> & positions,
                                          std::vector<float> & logits, bool evict_sessions, llama_opt_work & work) {
    check_open();
    touch(seq);
    if (positions.empty()) {
        return;
    }
    const size_t    chunk = params_.canonical ? chunk_ : params_.n_batch;
    llama_opt_batch b((int32_t) llama_n_batch(ctx_));
    llama_set_pos_gaps(ctx_, true);
    llama_set_pos_holes(ctx_, true);
    try {
        for (size_t i = 0; i < positions.size();) {
            const size_t stop = std::min(positions.size(), i + chunk);
            b.batch.n_tokens  = (int32_t) (stop - i);
            for (size_t j = i; j < stop; ++j) {
                b.set((int32_t) (j - i), seq, positions[j], tokens[positions[j]], j + 1 == positions.size());
            }
            decode_chunk(seq, b.batch, evict_sessions, work);
            i = stop;
        }
    } catch (...) {
        llama_set_pos_gaps(ctx_, false);
        llama_set_pos_holes(ctx_, false);
        llama_memory_seq_rm(llama_get_memory(ctx_), seq, (llama_pos) positions[0], -1);  // no half-computed prompt stays
        throw;
    }
    llama_set_pos_gaps(ctx_, false);
    llama_set_pos_holes(ctx_, false);
    const float * out = llama_get_logits_ith(ctx_, -1);
    logits.assign(out, out + model_->n_vocab());
}

std::vector<float> llama_opt_context::score_span(int32_t seq, const llama_token * tokens, size_t begin, size_t end,
                                                 uint32_t n_layers, uint32_t window, uint32_t last_layers,
                                                 uint32_t pool, bool evict_sessions, llama_opt_work & work) {
    check_open();
    if (!attn_capture_) {
        throw llama_opt_error(llama_opt_errc::invalid_argument,
            "speculative prefill with the model's own layers needs a context made with spec_prefill_enabled (the "
            "model's queries and keys are observed through the eval callback, set when the context is made)",
            "spec_prefill_enabled");
    }
    attn_capture_->arm_scorer(n_layers, (llama_pos) begin, end - begin, window);
    try {
        compute_span(seq, tokens, begin, end, nullptr, evict_sessions, work);
    } catch (...) {
        attn_capture_->disarm_scorer();
        throw;
    }
    attn_capture_->disarm_scorer();
    kv_remove(seq, (llama_pos) begin, -1);  // their KV stops at the scorer's layers
    const std::vector<llama_opt_spec_layer> layers = attn_capture_->scorer_layers();
    if (layers.empty()) {
        return {};
    }
    return llama_opt_spec_importance(attn_capture_->shape(), layers, end - begin, window, last_layers, pool);
}

bool llama_opt_context::compute_rows(const std::vector<llama_opt_row> & rows, std::vector<float> & logits,
                                     llama_opt_work & work) {
    check_open();
    const int32_t n = (int32_t) rows.size();
    if (n == 0 || n > (int32_t) llama_n_batch(ctx_)) {
        return false;  // llama.cpp takes at most n_batch tokens per call (the llama schedule's n_batch may be small)
    }
    llama_opt_batch b(n);
    b.batch.n_tokens = n;
    for (int32_t i = 0; i < n; ++i) {
        touch(rows[i].seq);
        b.set(i, rows[i].seq, rows[i].pos, rows[i].token, true);
    }
    int32_t rc;
    try {
        rc = decode_evicting(rows[0].seq, b.batch, /* evict */ false, false, work);  // rows never cost other sequences their KV
    } catch (...) {
        for (const llama_opt_row & r : rows) {
            llama_memory_seq_rm(llama_get_memory(ctx_), r.seq, (llama_pos) r.pos, -1);
        }
        throw;
    }
    if (rc != 0) {
        llama_opt_log_take_errors();  // llama.cpp's "failed to find a memory slot": expected here, not an error
        return false;
    }
    work.tokens += (uint64_t) n;
    work.passes += 1;
    const size_t n_vocab = model_->n_vocab();
    logits.resize((size_t) n * n_vocab);
    for (int32_t i = 0; i < n; ++i) {
        const float * out = llama_get_logits_ith(ctx_, i);
        std::copy(out, out + n_vocab, logits.begin() + (size_t) i * n_vocab);
    }
    return true;
}

size_t llama_opt_context::kv_truncate(int32_t seq, size_t pos) {
    slot & sl = slots_[seq];
    if (pos < sl.n_shared) {
        pos         = pos / block_ * block_;
        sl.n_shared = pos;
    }
    llama_memory_seq_rm(llama_get_memory(ctx_), seq, (llama_pos) pos, -1);
    release_blocks(seq, canonical() ? pos / block_ : 0);  // complete blocks below pos stay
    return pos;
}

void llama_opt_context::kv_remove(int32_t seq, llama_pos p0, llama_pos p1) {
    llama_memory_seq_rm(llama_get_memory(ctx_), seq, p0, p1);
}

void llama_opt_context::kv_drop(int32_t seq, size_t p0, size_t p1) {
    llama_memory_seq_rm(llama_get_memory(ctx_), seq, (llama_pos) p0, (llama_pos) p1);
    release_blocks(seq, p0 / block_);
}

void llama_opt_context::kv_share(int32_t src, int32_t dst, size_t p0, size_t p1) {
    llama_memory_seq_cp(llama_get_memory(ctx_), src, dst, (llama_pos) p0, (llama_pos) p1);
    slots_[dst].n_shared = std::max(slots_[dst].n_shared, p1);
    if (slots_[src].state == slot_state::session) {  // cached sequences never write again
        slots_[src].n_shared = std::max(slots_[src].n_shared, p1);
    }
}

llama_opt_in_place llama_opt_context::kv_prepare_in_place(int32_t seq, size_t keep, size_t n_old, size_t n_new) {
    llama_memory_t mem = llama_get_memory(ctx_);
    if (!canonical() || llama_memory_kv_bytes_per_pos(mem) == 0) {
        return llama_opt_in_place::unsupported;
    }
    // rows are written where the sequence's own rows are: past the edit they must be its alone
    for (size_t end; (end = (size_t) llama_memory_seq_shared_end(mem, seq)) > keep;) {
        const int32_t cell   = kv_cell(seq, end - 1);
        int32_t       holder = -1;
        for (size_t s = 0; s < slots_.size() && holder < 0; ++s) {
            if (slots_[s].state == slot_state::cached && kv_cell((int32_t) s, end - 1) == cell) {
                holder = (int32_t) s;
            }
        }
        if (holder < 0) {
            return llama_opt_in_place::shared;  // an open session's: it stays as it is
        }
        drop_sequence(holder);
        stats_.dedup_sequences_evicted += 1;
    }
    slots_[seq].n_shared = std::min(slots_[seq].n_shared, (size_t) llama_memory_seq_shared_end(mem, seq));
    // blocks past the sequence's last tile go above it, as a computation would place them
    return kv_make_room(seq, n_old, n_new, /* evict_sessions */ false) ? llama_opt_in_place::possible
                                                                       : llama_opt_in_place::no_room;
}

bool llama_opt_context::kv_tile_above(int32_t seq) const {
    return llama_memory_seq_tiles_free_above(llama_get_memory(ctx_), seq) > 0;
}

bool llama_opt_context::kv_room_after_drop(int32_t seq, size_t n_new) {
    llama_memory_t mem   = llama_get_memory(ctx_);
    auto           tiles = [&](size_t n) { return (n + align_ - 1) / align_; };
    // nothing is evicted unless it can be enough: the tiles no other sequence in use holds a cell in
    std::vector<char> held(n_ctx_ / align_ + 1, 0);
    for (size_t s = 0; s < slots_.size(); ++s) {
        const std::shared_ptr<llama_opt_seq_owner> owner = slots_[s].owner.lock();
        if ((int32_t) s != seq && slots_[s].state == slot_state::session && owner && owner->in_use()) {
            for (size_t p = 0, end = kv_end((int32_t) s); p < end; ++p) {
                const int32_t cell = kv_cell((int32_t) s, p);
                if (cell >= 0) {
                    held[(size_t) cell / align_] = 1;
                }
            }
        }
    }
    if ((size_t) std::count(held.begin(), held.begin() + n_ctx_ / align_, 0) < tiles(n_new)) {
        return false;
    }
    auto room = [&] {  // (the scratch sequence holds no cells outside a Tier-2 move: all empty tiles)
        const size_t own = tiles(kv_end(seq)) - tiles((size_t) llama_memory_seq_shared_end(mem, seq));
        return (size_t) llama_memory_seq_tiles_free_above(mem, scratch_seq()) + own;
    };
    while (room() < tiles(n_new)) {
        if (!evict_one(seq)) {
            return false;
        }
    }
    return true;
}

bool llama_opt_context::kv_make_room(int32_t seq, size_t n_old, size_t n_new, bool evict_sessions) {
    llama_memory_t mem   = llama_get_memory(ctx_);
    auto           tiles = [&](size_t n) { return (n + align_ - 1) / align_; };
    const size_t   grow  = tiles(n_new) > tiles(n_old) ? tiles(n_new) - tiles(n_old) : 0;
    if (grow == 0) {
        return true;  // (every decode step asks: the tiles are not counted when none is new)
    }
    while (llama_memory_seq_tiles_free_above(mem, seq) < grow) {
        // only KV above the sequence's highest tile is in the way (all of it, for a sequence without KV)
        const size_t top = kv_top(seq);
        if (!evict_one(seq, !evict_sessions, top == 0 ? 0 : (top + align_ - 1) / align_ * align_)) {
            return false;
        }
    }
    return true;
}

llama_opt_error llama_opt_context::kv_full() const {
    return llama_opt_error(llama_opt_errc::context_overflow,
        "the KV cache is full (" + std::to_string(n_ctx_) + " cells shared by all sessions of this context); close "
        "other sessions or create the Context with a larger n_ctx", "n_ctx");
}

bool llama_opt_context::kv_park(int32_t seq, size_t from, size_t to, size_t n) {
    return llama_memory_seq_move(llama_get_memory(ctx_), seq, scratch_seq(), (llama_pos) from, (llama_pos) (from + n),
                                 (llama_pos) to - (llama_pos) from);
}

void llama_opt_context::kv_unpark(int32_t seq, size_t p0, size_t p1) {
    llama_memory_t mem = llama_get_memory(ctx_);
    llama_memory_seq_cp(mem, scratch_seq(), seq, (llama_pos) p0, (llama_pos) p1);  // the same cells, no copy
    llama_memory_seq_rm(mem, scratch_seq(), (llama_pos) p0, (llama_pos) p1);
}

void llama_opt_context::kv_clear_parked() {
    llama_memory_seq_rm(llama_get_memory(ctx_), scratch_seq(), -1, -1);
}

size_t llama_opt_context::kv_end(int32_t seq) const {
    return (size_t) (llama_memory_seq_pos_max(llama_get_memory(ctx_), seq) + 1);  // -1: none
}

size_t llama_opt_context::kv_top(int32_t seq) const {
    const size_t end = kv_end(seq);
    return end == 0 ? 0 : (size_t) kv_cell(seq, end - 1) + 1;  // cells are in position order
}

int32_t llama_opt_context::kv_cell(int32_t seq, size_t pos) const {
    return llama_memory_seq_cell(llama_get_memory(ctx_), seq, (llama_pos) pos);
}

bool llama_opt_context::kv_read(int32_t seq, size_t p0, size_t p1, uint8_t * rows) const {
    return llama_memory_seq_kv_read(llama_get_memory(ctx_), seq, (llama_pos) p0, (llama_pos) p1, rows);
}

bool llama_opt_context::kv_write(int32_t seq, size_t p0, size_t p1, const uint8_t * rows) {
    llama_memory_t mem = llama_get_memory(ctx_);
    bool written = llama_memory_seq_kv_write(mem, seq, (llama_pos) p0, (llama_pos) p1, rows);
    while (!written && evict_one(seq, /* cached_only */ true)) {
        written = llama_memory_seq_kv_write(mem, seq, (llama_pos) p0, (llama_pos) p1, rows);
    }
    return written;
}

void llama_opt_context::hold_block(int32_t seq, const llama_opt_kv_block * block) {
    pool_->ref(block, seq);
    slots_[seq].blocks.push_back(block->id);
}

const llama_opt_kv_block * llama_opt_context::pool_insert(int32_t seq, uint64_t hash, uint64_t parent, uint32_t index,
                                                          const llama_token * tokens) {
    const llama_opt_kv_block * b = pool_->insert(hash, parent, index, tokens, block_);
    while (!b && evict_for_pool(seq)) {
        b = pool_->insert(hash, parent, index, tokens, block_);
    }
    return b;
}
