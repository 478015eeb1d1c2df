#pragma once

// base/numerics: rules of llama.cpp's numerics on this build that exactness rests on
// (docs/exactness.md; measured again by tests/test_row_invariance.py and tests/test_flash_attn_shared_kv.py).

#include <cstdint>

// Cells per tile of the KV that a decode step's flash attention reduces on its own (patches/0003).
// With flash attention a sequence's blocks start at multiples of it (engine/context.cpp), so
// every tile holds one block's cells and a step's result does not depend on other sequences.
constexpr uint32_t LLAMA_OPT_FA_KV_TILE = 64;

// Batches of up to this many tokens compute each row exactly as a one-token decode step would
// (patches/0006): the memo checks a draft and the step before it in one such batch.
constexpr uint32_t LLAMA_OPT_ROW_INVARIANT_BATCH = 16;

// memo: the longest suffix of the history matched earlier, and so the longest draft
// (memo_draft_max's bound; methods/memo.h explains the policy)
constexpr uint32_t LLAMA_OPT_MEMO_MATCH_MAX = 8;
static_assert(LLAMA_OPT_MEMO_MATCH_MAX + 1 <= LLAMA_OPT_ROW_INVARIANT_BATCH,
              "a draft and the step before it must fit one row-invariant batch");
