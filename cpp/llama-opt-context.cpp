#include "llama-opt-context.h"

#include "llama-opt-log.h"
#include "llama-opt-session.h"
#include "llama.h"

#include <algorithm>
#include <thread>

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
    if (params.n_seq_max < 1 || params.n_seq_max > 256) {
        invalid("n_seq_max must be between 1 and 256 (got " + std::to_string(params.n_seq_max) + ")", "n_seq_max");
    }
    if (params.n_threads < 0 || params.n_threads_batch < 0) {
        invalid("n_threads must be positive, or 0 for all hardware threads", "n_threads");
    }

    const int32_t hw = (int32_t) std::max(1u, std::thread::hardware_concurrency());
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = params.n_ctx;
    // One ubatch per llama_decode call: we choose every chunk boundary ourselves.
    cp.n_batch         = params.n_batch;
    cp.n_ubatch        = params.n_batch;
    cp.n_seq_max       = params.n_seq_max;
    cp.n_threads       = params.n_threads > 0 ? params.n_threads : hw;
    cp.n_threads_batch = params.n_threads_batch > 0 ? params.n_threads_batch : cp.n_threads;
    cp.flash_attn_type = params.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.swa_full        = params.swa_full;
    cp.kv_unified      = true;  // sessions can share KV cells of a common prefix
    cp.no_perf         = true;

    llama_opt_log_take_errors();
    ctx_ = llama_init_from_model(model_->get(), cp);
    if (!ctx_) {
        const std::string why = llama_opt_log_take_errors();
        throw llama_opt_error(llama_opt_errc::invalid_argument,
            "llama.cpp could not create the context" + (why.empty() ? "" : ":\n" + why) +
            "\nTry a smaller n_ctx (memory) or other parameters.", "n_ctx");
    }
    n_ctx_ = llama_n_ctx(ctx_);
    sessions_.resize(params.n_seq_max);
}

llama_opt_context::~llama_opt_context() {
    llama_free(ctx_);
}

void llama_opt_context::check_open() const {
    if (!ctx_) {
        throw llama_opt_error(llama_opt_errc::session_closed, "the context is closed; create a new Context");
    }
}

std::shared_ptr<llama_opt_session> llama_opt_context::open_session() {
    std::lock_guard<std::mutex> lock(mutex_);
    check_open();
    for (size_t seq = 0; seq < sessions_.size(); ++seq) {
        const auto old = sessions_[seq].lock();
        if (!old || old->closed_) {  // a closed session has given its KV back already
            auto session   = std::make_shared<llama_opt_session>(shared_from_this(), (int32_t) seq);
            sessions_[seq] = session;
            return session;
        }
    }
    throw llama_opt_error(llama_opt_errc::context_overflow,
        "all " + std::to_string(sessions_.size()) + " session slots of this context are in use; close a session "
        "or create the Context with a larger n_seq_max", "n_seq_max");
}

void llama_opt_context::close() {
    std::vector<std::shared_ptr<llama_opt_session>> open;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        for (auto & weak : sessions_) {
            if (auto s = weak.lock()) {
                open.push_back(s);
            }
        }
    }
    for (auto & s : open) {
        s->close();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    llama_free(ctx_);
    ctx_ = nullptr;
}

uint32_t llama_opt_context::n_sessions() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return (uint32_t) std::count_if(sessions_.begin(), sessions_.end(), [](const auto & w) {
        const auto s = w.lock();
        return s && !s->closed_;
    });
}

llama_opt_stats llama_opt_context::stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
}

void llama_opt_context::reset_stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.reset();
}

void llama_opt_context::count(llama_opt_stats & session_stats, uint64_t llama_opt_stats::* counter, uint64_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    session_stats.*counter += n;
    stats_.*counter += n;
}

void llama_opt_context::forget(int32_t seq, size_t from) {
    std::lock_guard<std::mutex> lock(mutex_);
    check_open();
    llama_memory_seq_rm(llama_get_memory(ctx_), seq, (llama_pos) from, -1);
}

void llama_opt_context::release(int32_t seq) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ctx_) {
        llama_memory_seq_rm(llama_get_memory(ctx_), seq, -1, -1);
    }
    // sessions_[seq] expires with the session object itself
}

void llama_opt_context::decode(int32_t seq, const std::vector<llama_token> & tokens, size_t begin, size_t end,
                               std::vector<float> & logits, llama_opt_stats & session_stats,
                               uint64_t llama_opt_stats::* counter) {
    std::lock_guard<std::mutex> lock(mutex_);
    check_open();
    llama_memory_t mem = llama_get_memory(ctx_);

    const size_t n_chunk = params_.n_batch;
    llama_batch  batch   = llama_batch_init((int32_t) std::min(n_chunk, end - begin), 0, 1);
    for (size_t pos = begin; pos < end; pos += n_chunk) {
        const size_t n = std::min(n_chunk, end - pos);
        batch.n_tokens = (int32_t) n;
        for (size_t i = 0; i < n; ++i) {
            batch.token[i]     = tokens[pos + i];
            batch.pos[i]       = (llama_pos) (pos + i);
            batch.n_seq_id[i]  = 1;
            batch.seq_id[i][0] = seq;
            batch.logits[i]    = pos + i + 1 == end;
        }
        const int32_t rc = llama_decode(ctx_, batch);
        if (rc != 0) {
            llama_batch_free(batch);
            llama_memory_seq_rm(mem, seq, (llama_pos) begin, -1);
            const std::string why = llama_opt_log_take_errors();
            if (rc == 1) {
                throw llama_opt_error(llama_opt_errc::context_overflow,
                    "the KV cache is full (" + std::to_string(n_ctx_) + " cells shared by all sessions of this "
                    "context); close other sessions or create the Context with a larger n_ctx", "n_ctx");
            }
            throw llama_opt_error(llama_opt_errc::decode_failed,
                "llama_decode failed with code " + std::to_string(rc) + (why.empty() ? "" : ":\n" + why));
        }
        for (llama_opt_stats * s : { &stats_, &session_stats }) {
            s->*counter += n;
            s->forward_passes += 1;
        }
    }
    llama_batch_free(batch);

    const float * out = llama_get_logits_ith(ctx_, -1);
    logits.assign(out, out + model_->n_vocab());
}
