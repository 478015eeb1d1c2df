#include "methods/h2o-prefill.h"

#include "methods/h2o.h"

#include <algorithm>
#include <chrono>

void llama_opt_h2o_prefill(llama_opt_context & ctx, int32_t seq, const llama_token * tokens, size_t end,
                           std::vector<float> * logits, llama_opt_work & work, llama_opt_h2o_work & h2o_work) {
    ctx.check_open();
    llama_opt_h2o_capture * capture = ctx.h2o_capture();
    if (!capture) {
        throw llama_opt_error(llama_opt_errc::feature_unavailable, "H2O prefill needs a context made with h2o_enabled");
    }
    ctx.memory().touch(seq);
    using clock = std::chrono::steady_clock;
    auto us = [](clock::time_point since) {
        return (uint64_t) std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - since).count();
    };
    const llama_h2o_params         p      = llama_opt_h2o_params(ctx.settings().config);
    const std::vector<int32_t> &   layers = capture->layers();
    llama_h2o                      state(p, (uint32_t) layers.size(), capture->n_head(), (uint32_t) end);
    std::vector<llama_h2o_subset>  subsets(layers.size());
    llama_opt_batch                b((int32_t) p.chunk_size);
    llama_context *                lctx = ctx.get();
    try {
        for (size_t pos = 0; pos < end;) {
            const size_t   stop = std::min(end, pos + p.chunk_size);
            const uint32_t n    = (uint32_t) (stop - pos);
            auto           t0   = clock::now();
            for (size_t i = 0; i < layers.size(); ++i) {
                state.subset((uint32_t) i, n, subsets[i]);
                if (!llama_set_attn_subset(lctx, layers[i], (int32_t) capture->n_head(), subsets[i].pos.data(),
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
            capture->arm();
            ctx.decode_chunk(seq, b.batch, /* evict_sessions */ false, work);
            capture->disarm();
            h2o_work.chunks += 1;

            t0 = clock::now();
            for (size_t i = 0; i < layers.size(); ++i) {
                const std::vector<float> & colsum = capture->colsum(i);
                if (colsum.size() != (size_t) capture->n_head() * subsets[i].n_keys()) {
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
        capture->disarm();
        llama_clear_attn_subsets(lctx);
        ctx.memory().remove(seq, 0, -1);  // no half-computed prompt stays
        throw;
    }
    llama_clear_attn_subsets(lctx);
    if (logits) {
        ctx.last_logits(*logits);
    }
}
