#pragma once

// session/attn-drop: the Tier-2 methods that take KV out of attention by what the
// appended tokens are (off by default). drop_span: the KV of a span leaves the sequence (its cells
// are freed; the positions of the rest stay, so RoPE distances are unchanged), on which the sink +
// recent window baseline is built. Sparse attention over tool results (000 §4.2,
// sparse_attn_enabled): before a query is computed, each earlier tool result is scored against it
// (llama_opt_sparse_scorer) and its irrelevant spans are dropped; its first and last tokens always
// stay. Appends marked as the system prompt are never pruned (session/attn-prune).
//
// A session with a hole is approximate from the hole on (approx_from): its KV is never pooled,
// shared by a fork or persisted (those take complete blocks below n_canonical, kept below it).

#include "session/attn-prune.h"
#include "session/sync.h"

// What appended tokens are: the system prompt is never pruned (attn_prune), tool results are
// scored against the next query and their irrelevant spans dropped (sparse_attn).
enum class llama_opt_span_kind { text, system, tool };

class llama_opt_session_attn_drop {
public:
    llama_opt_session_attn_drop(llama_opt_session_history & history, llama_opt_session_counters & counters,
                                const llama_opt_approx_settings & approx, llama_opt_session_prefill & prefill,
                                llama_opt_session_sync & sync, llama_opt_session_attn_prune & prune)
        : history_(history), counters_(counters), approx_(approx), prefill_(prefill), sync_(sync), prune_(prune) {}

    // The KV of positions [p0, p1) leaves attention; the last evaluated token always keeps its KV.
    void drop_span(size_t p0, size_t p1);
    // Appends `tokens` of `kind`, with the methods that are on; with score_tools false a text append
    // leaves the tool results not yet scored for a later one (the text between two tool results of
    // one sync).
    void append(const std::vector<llama_token> & tokens, llama_opt_span_kind kind, bool score_tools = true);
    // Syncs to `tokens` with its tool results marked (llama_opt_session::sync).
    void sync(const std::vector<llama_token> & tokens, const std::vector<llama_opt_span> & tool_spans);
    // What a fork keeps: the tool results not yet scored, the end of the system prompt.
    void copy_marks_to(llama_opt_session_attn_drop & fork) const;

private:
    void drop_irrelevant_tool_spans(const std::vector<llama_token> & query);

    llama_opt_session_history &       history_;
    llama_opt_session_counters &      counters_;
    const llama_opt_approx_settings & approx_;
    llama_opt_session_prefill &       prefill_;
    llama_opt_session_sync &          sync_;
    llama_opt_session_attn_prune &    prune_;
    size_t                            system_end_ = 0;  // the end of the system prompt
    std::vector<llama_opt_span>       tool_spans_;      // tool results not yet scored
};
