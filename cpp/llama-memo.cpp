#include "llama-memo.h"

#include <algorithm>

llama_opt_memo_draft llama_opt_memo_find(const llama_token * history, size_t n, uint32_t max_tokens) {
    llama_opt_memo_draft draft;
    if (n < 2 || max_tokens == 0) {
        return draft;
    }
    const llama_token last = history[n - 1];
    size_t best_end = 0;  // one past the earlier occurrence's last token
    // newest first, so that of equally long matches the most recent wins
    for (size_t i = n - 1; i-- > 0;) {
        if (history[i] != last) {
            continue;
        }
        uint32_t len = 1;
        while (len < LLAMA_OPT_MEMO_MATCH_MAX && len <= i && history[i - len] == history[n - 1 - len]) {
            ++len;
        }
        if (len > draft.match) {
            draft.match = len;
            best_end    = i + 1;
            if (len == LLAMA_OPT_MEMO_MATCH_MAX) {
                break;
            }
        }
    }
    if (draft.match >= LLAMA_OPT_MEMO_MATCH_MIN) {
        const size_t stop = std::min(n, best_end + std::min(draft.match, max_tokens));
        draft.tokens.assign(history + best_end, history + stop);
    }
    return draft;
}
