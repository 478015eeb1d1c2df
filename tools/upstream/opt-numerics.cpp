// Linked into llama.cpp's own examples/simple to make `llama-simple-opt-numerics`, the parity test's
// reference: upstream's program with the two numerics settings that pyllamaopt's patches add and its
// engine turns on at start (cpp/engine/model.cpp). Both change float rounding only, so against the
// stock program a near-tie greedy token can differ (docs/exactness.md, "Against upstream llama.cpp").
#include "ggml-cpu.h"
#include "base/numerics.h"  // LLAMA_OPT_FA_KV_TILE, LLAMA_OPT_ROW_INVARIANT_BATCH

namespace {
struct opt_numerics {
    opt_numerics() {
        ggml_cpu_set_flash_attn_kv_tile(LLAMA_OPT_FA_KV_TILE);                // patches/0003
        ggml_cpu_set_row_invariant_batch(LLAMA_OPT_ROW_INVARIANT_BATCH);      // patches/0006
    }
} on_start;
}  // namespace
