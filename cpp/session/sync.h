#pragma once

// session/sync: sets a session's history to a full token list. Exact mode keeps the KV
// of the common prefix (diff_enabled) and computes the rest. Tier 2 (diff_reuse_shifted, opt-in):
// after an edit, the KV of the unchanged spans that follow it is reused at their new positions,
// moved within the session's own cells, and only the tokens around them are computed
// (docs/exactness.md): this object plans the moves and computes the rest; the KV memory parks
// the spans (checking first that it can) and gives them back after the history's cut.

#include "session/prefill.h"

class llama_opt_session_sync {
public:
    llama_opt_session_sync(llama_opt_session_history & history, llama_opt_session_counters & counters,
                           llama_opt_session_prefill & prefill)
        : history_(history), counters_(counters), prefill_(prefill) {}

    // On a bad token or an overflow the history is unchanged; if computing fails, it is cut back
    // to the tokens whose KV exists.
    void sync(const std::vector<llama_token> & tokens);

private:
    // the spans whose KV is reused at a shifted position, in position order
    std::vector<llama_opt_span_move> plan_shifted(const std::vector<llama_token> & tokens, size_t keep) const;
    // false, with nothing computed and the reason counted, if the plan cannot work (then sync does
    // exact mode's work)
    bool sync_shifted(const std::vector<llama_token> & tokens, size_t keep, const std::vector<llama_opt_span_move> & moves);

    llama_opt_session_history &  history_;
    llama_opt_session_counters & counters_;
    llama_opt_session_prefill &  prefill_;
};
