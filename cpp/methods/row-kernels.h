#pragma once

// methods/row-kernels: which of two exact paths a small batch's matrix products take, per weight type
// and row count. ggml-cpu computes a batch of up to 16 rows so that every row gets a one-row decode
// step's bits (patch 0006), either row by row or by kernels that read each weight block once for all
// rows (0009). Which is faster depends on the CPU and the type: on an AMD EPYC (AVX-512 VNNI) tinyBLAS
// costs Qwen2.5-Coder's Q8_0/Q5_0 weights 1.17 x row by row at 2-4 rows and saves 0.77 x at 16; on an
// Intel machine it won at every size (docs/benchmarks/log/chat-route.md). So each (type, rows) cell
// times both arms as the context runs (patch 0019: the op's wall time per weight element, decayed over
// the cell's last ~10 decodes), takes the faster, and gives the other one decode in probe_every to keep measuring.
// It decides how fast, never what: both arms give the same bits (Tier 1).

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

class llama_opt_row_kernels {
public:
    static constexpr uint32_t max_rows    = 16;   // GGML_CPU_ROW_KERNEL_MAX_ROWS
    static constexpr uint32_t max_types   = 64;   // more than ggml's weight types
    static constexpr uint32_t warmup      = 3;    // samples of each arm before the times decide
    static constexpr uint32_t probe_every = 16;   // a cell's slower arm gets one sample in this many
    static constexpr double   decay       = 0.9;  // per sample of the cell

    using row_times = uint64_t[max_rows + 1];  // per row count: ns, or weight elements multiplied

    // The table for the next decode: bit r of masks[type] set = the multi-row kernels at r rows.
    void table(uint32_t * masks, size_t n_types);
    // That decode's matrix products of 1..max_rows rows, per (type, rows): their wall time and weight
    // elements. Each cell with work is credited to the arm `masks` (what table() gave) chose for it.
    void measured(const uint32_t * masks, const row_times * ns, const row_times * work, size_t n_types);

    struct arm_report {
        double   ns_per_work;  // decayed mean; 0 before a sample
        uint32_t samples;
    };
    struct cell_report {
        uint32_t   type, rows;
        bool       multi;  // the arm the next decode takes
        arm_report multi_arm, one_arm;
    };
    std::vector<cell_report> report() const;  // the cells measured so far

private:
    struct arm {
        double   ns = 0, work = 0;  // decayed sums
        uint32_t samples = 0;
        double   mean() const { return work > 0 ? ns / work : 0; }
    };
    struct cell {
        arm      multi, one;
        uint32_t since_probe = 0;  // samples of the faster arm since the slower one's last
        bool faster_is_multi() const { return multi.mean() <= one.mean(); }
        bool choice() const;
    };

    mutable std::mutex mutex_;
    cell               cells_[max_types][max_rows + 1];
};
