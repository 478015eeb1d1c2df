#include "engine/context.h"

#include "engine/log.h"
#include "ggml-cpu.h"
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

    codec_ = llama_opt_kv_codec::from_config(cfg);
    codec_.check(*model_, params.flash_attn);
    const bool scores_attention = cfg.attn_prune_enabled || (cfg.spec_prefill_enabled && cfg.spec_prefill_draft_model.empty());
    if ((scores_attention || cfg.h2o_enabled) && !codec_.identity()) {
        // attention scores read K rows as F16 from rows laid out as F16 K and V (methods/attn-capture;
        // llama.cpp stores a quantized K rotated); H2O's gathered attention (patches/0010) was built
        // and measured on F16 rows only
        const std::string setting = codec_.k.quantized() ? codec_.k.setting : codec_.v.setting;
        throw llama_opt_error(llama_opt_errc::config,
            "attention scores (attn_prune_enabled, spec_prefill_enabled without a draft model) and H2O "
            "(h2o_enabled) read the KV cache's K rows as F16: use " + setting + "='f16' with them (they find "
            "K in rows laid out as F16 K and V: a quantized V is refused too)", setting);
    }
    if (cfg.diff_reuse_shifted && codec_.k.type == GGML_TYPE_Q4_0) {
        // llama.cpp's K-shift quantizes a moved K again; V rows move as they are stored, whatever their type
        throw llama_opt_error(llama_opt_errc::config,
            "diff_reuse_shifted with " + codec_.k.setting + "='q4_0' is refused: its moved K rows, rotated and "
            "quantized again, measured a KL of 0.11 against computing the edited history with q4_0 (q8_0: 0.004; "
            "f16: 0.002; docs/exactness.md): use " + codec_.k.setting + "='q8_0' with it (V's type does not "
            "matter here: V rows move as they are)", codec_.k.setting);
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
    cp.type_k          = codec_.k.type;
    cp.type_v          = codec_.v.type;
    cp.kv_unified      = true;  // sessions share the KV cells of a common prefix
    cp.no_perf         = true;
    // Tier 2: observe queries (set only then: exact mode computes in one graph)
    if (scores_attention) {
        attn_capture_    = std::make_unique<llama_opt_attn_capture>(model_->get(), cfg.attn_prune_queries);
        cp.cb_eval           = &llama_opt_attn_capture::callback;
        cp.cb_eval_user_data = attn_capture_.get();
    }
    if (cfg.h2o_enabled) {  // Tier 2: observe the H2O chunks' softmax weights
        h2o_capture_ = std::make_unique<llama_opt_h2o_capture>(model_->get());
        llama_opt_h2o_check_settings(cfg, *h2o_capture_, cp.n_batch, params.flash_attn, attn_capture_ != nullptr);
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
    ctx_.reset(llama_init_from_model(model_->get(), cp));
    if (!ctx_) {
        const std::string why = llama_opt_log_take_errors();
        throw llama_opt_error(llama_opt_errc::invalid_argument,
            "llama.cpp could not create the context" + (why.empty() ? "" : ":\n" + why) +
            "\nTry a smaller n_ctx (memory) or other parameters.", "n_ctx");
    }
    // (from here on a throw frees ctx_)
    n_ctx_ = llama_n_ctx(ctx_.get());
    llama_memory_t mem = llama_get_memory(ctx_.get());
    if (attn_capture_) {
        attn_capture_->check_layout(llama_memory_kv_bytes_per_pos(mem));
    }
    if (cfg.spec_prefill_enabled && !cfg.spec_prefill_draft_model.empty()) {
        spec_draft_ = std::make_unique<llama_opt_spec_draft>(cfg.spec_prefill_draft_model, *model_, n_ctx_,
                                                             params.n_batch, cp.n_threads);
    }
    llama_opt_kv_memory_params mp;
    mp.n_ctx      = n_ctx_;
    mp.n_seq      = params.n_seq_max;
    mp.block      = block_;
    mp.align      = align_;
    mp.row_align  = row_align();
    mp.canonical  = params.canonical;
    mp.flash_attn = params.flash_attn;
    mp.swa_full   = params.swa_full;
    mp.codec      = codec_;
    memory_ = std::make_unique<llama_opt_kv_memory>(mem, *model_, mp, cfg, stats_);
}

void llama_opt_context::close() {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    memory_->close();  // (owners save their KV while the llama context is still there)
    memo_outputs_.clear();
    ctx_.reset();
}

llama_opt_stats llama_opt_context::stats() const {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    llama_opt_stats s = stats_;
    s += sessions_sum() - at_reset_;  // (counters only grow: no underflow)
    if (const llama_opt_persist_write_behind * writer = memory_->write_behind()) {
        writer->counts().add_to(s);  // counted by its thread, as it goes
    }
    return s;
}

void llama_opt_context::reset_stats() {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    stats_.reset();
    at_reset_ = sessions_sum();
    if (llama_opt_persist_write_behind * writer = memory_->write_behind()) {
        writer->counts().reset();
    }
}

void llama_opt_context::count_batch(const llama_opt_work & work) {
    stats_.tokens_decoded += work.tokens;
    stats_.forward_passes += work.passes;
    stats_.forward_us += work.us;
}

void llama_opt_context::follow(const llama_opt_stats & session_stats) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    followed_.push_back(&session_stats);
}

void llama_opt_context::unfollow(const llama_opt_stats & session_stats) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    followed_.erase(std::find(followed_.begin(), followed_.end(), &session_stats));
    gone_ += session_stats;
}

llama_opt_stats llama_opt_context::sessions_sum() const {
    llama_opt_stats sum = gone_;
    for (const llama_opt_stats * s : followed_) {
        sum += *s;
    }
    return sum;
}

void llama_opt_batch::set(int32_t i, int32_t seq, size_t pos, llama_token token, bool logits) {
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

void llama_opt_context::last_logits(std::vector<float> & logits) const {
    const float * out = llama_get_logits_ith(ctx_.get(), -1);
    logits.assign(out, out + model_->n_vocab());
}

void llama_opt_context::compute_span(int32_t seq, const llama_token * tokens, size_t begin, size_t end,
                                     std::vector<float> * logits, bool evict_sessions, llama_opt_work & work,
                                     const llama_opt_row_logits & each_row) {
    check_open();
    memory_->touch(seq);
    llama_opt_batch b((int32_t) llama_n_batch(ctx_.get()));
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
                b.set((int32_t) (p - pos), seq, p, tokens[p], each_row || (logits && p + 1 == end));
            }
            decode_chunk(seq, b.batch, evict_sessions, work);
            for (size_t p = pos; each_row && p < stop; ++p) {
                each_row(p, llama_get_logits_ith(ctx_.get(), (int32_t) (p - pos)));
            }
            pos = stop;
        }
    } catch (...) {
        memory_->remove(seq, (llama_pos) begin, -1);  // no half-computed span stays
        throw;
    }
    if (logits) {
        last_logits(*logits);
    }
}

void llama_opt_context::compute_positions(int32_t seq, const llama_token * tokens, const std::vector<size_t> & positions,
                                          std::vector<float> & logits, bool evict_sessions, llama_opt_work & work) {
    check_open();
    memory_->touch(seq);
    if (positions.empty()) {
        return;
    }
    const size_t    chunk = params_.canonical ? chunk_ : params_.n_batch;
    llama_opt_batch b((int32_t) llama_n_batch(ctx_.get()));
    llama_set_pos_gaps(ctx_.get(), true);
    llama_set_pos_holes(ctx_.get(), true);
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
        llama_set_pos_gaps(ctx_.get(), false);
        llama_set_pos_holes(ctx_.get(), false);
        memory_->remove(seq, (llama_pos) positions[0], -1);  // no half-computed prompt stays
        throw;
    }
    llama_set_pos_gaps(ctx_.get(), false);
    llama_set_pos_holes(ctx_.get(), false);
    last_logits(logits);
}

bool llama_opt_context::compute_rows(const std::vector<llama_opt_row> & rows, std::vector<float> & logits,
                                     llama_opt_work & work) {
    check_open();
    const int32_t n = (int32_t) rows.size();
    if (n == 0 || n > (int32_t) llama_n_batch(ctx_.get())) {
        return false;  // llama.cpp takes at most n_batch tokens per call (the llama schedule's n_batch may be small)
    }
    llama_opt_batch b(n);
    b.batch.n_tokens = n;
    for (int32_t i = 0; i < n; ++i) {
        memory_->touch(rows[i].seq);
        b.set(i, rows[i].seq, rows[i].pos, rows[i].token, true);
    }
    int32_t rc;
    try {
        rc = decode_evicting(rows[0].seq, b.batch, /* evict */ false, false, work);  // rows never cost other sequences their KV
    } catch (...) {
        for (const llama_opt_row & r : rows) {
            memory_->remove(r.seq, (llama_pos) r.pos, -1);
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
        const float * out = llama_get_logits_ith(ctx_.get(), i);
        std::copy(out, out + n_vocab, logits.begin() + (size_t) i * n_vocab);
    }
    return true;
}

void llama_opt_context::decode_chunk(int32_t seq, const llama_batch & batch, bool evict_sessions, llama_opt_work & work) {
    if (decode_evicting(seq, batch, true, evict_sessions, work) != 0) {
        throw memory_->full_error();
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
        return llama_decode(ctx_.get(), batch);
    };
    const bool timed = set_row_kernel_table(batch.n_tokens);
    int32_t    rc    = decode();
    while (rc == 1 && evict && memory_->evict_one(seq, !evict_sessions)) {  // no room: free the least recently used KV, retry
        rc = decode();
    }
    if (timed) {
        row_kernels_measured(rc == 0);
    }
    work.us += (uint64_t) std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
    if (rc != 0 && rc != 1) {
        const std::string why = llama_opt_log_take_errors();
        throw llama_opt_error(llama_opt_errc::decode_failed,
            "llama_decode failed with code " + std::to_string(rc) + (why.empty() ? "" : ":\n" + why));
    }
    return rc;
}

static_assert(GGML_TYPE_COUNT <= llama_opt_row_kernels::max_types, "a weight type beyond the row-kernel table");
static_assert(GGML_CPU_ROW_KERNEL_MAX_ROWS == llama_opt_row_kernels::max_rows, "the row-kernel table's rows");

bool llama_opt_context::set_row_kernel_table(int32_t n_tokens) {
    // set on every decode: the table is the calling thread's, and another context may have set it there
    const uint32_t mode = settings_.config.row_kernels;
    if (mode != 2) {
        static const uint32_t row_by_row[GGML_TYPE_COUNT] = {};
        ggml_cpu_set_row_invariant_kernel_table(mode == 0 ? row_by_row : nullptr, 0);
        return false;
    }
    row_kernels_.table(row_kernel_masks_.data(), GGML_TYPE_COUNT);
    // timed only for decodes of small batches: a prefill chunk's one-row tail (its last layer after
    // the output rows are picked) is not a decode step's one-row work, and would share that cell
    const bool timed = n_tokens <= (int32_t) llama_opt_row_kernels::max_rows;
    ggml_cpu_set_row_invariant_kernel_table(row_kernel_masks_.data(), timed);
    return timed;
}

void llama_opt_context::row_kernels_measured(bool decoded) {
    // untimed from here: another decode on this thread (a draft model's) is not this context's
    ggml_cpu_set_row_invariant_kernel_table(row_kernel_masks_.data(), 0);
    llama_opt_row_kernels::row_times ns[GGML_TYPE_COUNT]   = {};
    llama_opt_row_kernels::row_times work[GGML_TYPE_COUNT] = {};
    ggml_cpu_take_row_invariant_kernel_times(ns, work);  // taken either way: the next decode starts from zero
    if (decoded) {
        row_kernels_.measured(row_kernel_masks_.data(), ns, work, GGML_TYPE_COUNT);
    }
}
