#include "methods/row-kernels.h"

#include <algorithm>

bool llama_opt_row_kernels::cell::choice() const {
    if (multi.samples < warmup || one.samples < warmup) {
        return multi.samples <= one.samples;  // the arm with fewer samples, multi-row first
    }
    const bool faster = faster_is_multi();
    return since_probe + 1 >= probe_every ? !faster : faster;
}

void llama_opt_row_kernels::table(uint32_t * masks, size_t n_types) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t t = 0; t < n_types; ++t) {
        masks[t] = 0;
        for (uint32_t r = 1; r <= max_rows; ++r) {
            masks[t] |= (t < max_types && !cells_[t][r].choice() ? 0u : 1u) << r;
        }
    }
}

void llama_opt_row_kernels::measured(const uint32_t * masks, const row_times * ns, const row_times * work,
                                     size_t n_types) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t t = 0; t < std::min<size_t>(n_types, max_types); ++t) {
        for (uint32_t r = 1; r <= max_rows; ++r) {
            if (work[t][r] == 0) {
                continue;
            }
            cell &     c       = cells_[t][r];
            const bool multi   = masks[t] >> r & 1;
            const bool warm    = c.multi.samples >= warmup && c.one.samples >= warmup;
            const bool faster  = warm && multi == c.faster_is_multi();
            arm &      a       = multi ? c.multi : c.one;
            double     took_ns = (double) ns[t][r];
            if (a.samples >= warmup) {  // more than twice the arm's mean is the machine's noise (a preemption)
                took_ns = std::min(took_ns, 2 * a.mean() * (double) work[t][r]);
            }
            for (arm * both : { &c.multi, &c.one }) {  // per sample of the cell: a rarely probed arm's
                both->ns *= decay;                        // mean is its last probes', not old history
                both->work *= decay;
            }
            a.ns += took_ns;
            a.work += (double) work[t][r];
            a.samples += 1;
            c.since_probe = warm && !faster ? 0 : c.since_probe + 1;
        }
    }
}

std::vector<llama_opt_row_kernels::cell_report> llama_opt_row_kernels::report() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<cell_report>    out;
    for (uint32_t t = 0; t < max_types; ++t) {
        for (uint32_t r = 1; r <= max_rows; ++r) {
            const cell & c = cells_[t][r];
            if (c.multi.samples + c.one.samples > 0) {
                out.push_back({ t, r, c.choice(), { c.multi.mean(), c.multi.samples }, { c.one.mean(), c.one.samples } });
            }
        }
    }
    return out;
}
