#include "session/attn-drop.h"

#include <algorithm>
#include <climits>

void llama_opt_session_attn_drop::drop_span(size_t p0, size_t p1) {
    if (p0 > p1) {
        throw llama_opt_error(llama_opt_errc::invalid_argument,
            "drop_span needs start <= end, got " + std::to_string(p0) + " > " + std::to_string(p1));
    }
    history_.drop_draft();
    p1 = std::min(p1, history_.n_evaluated() > 0 ? history_.n_evaluated() - 1 : 0);  // the last token keeps its KV
    if (p0 >= p1) {
        return;
    }
    prune_.forget_span(p0, p1);  // an explicit drop is final
    for (const llama_opt_span & live : history_.live_ranges()) {
        const size_t a = std::max(p0, live.first), b = std::min(p1, live.second);
        if (a < b) {
            history_.drop_kv(a, b);
        }
    }
}

void llama_opt_session_attn_drop::copy_marks_to(llama_opt_session_attn_drop & fork) const {
    fork.system_end_ = system_end_;
    fork.tool_spans_ = tool_spans_;
}

// Words whose tokens mark structure in tool output (000 §4.2's structural heuristic).
static std::vector<llama_token> cue_tokens(const llama_opt_model & model) {
    static const char * words[] = { "error", "Error", "ERROR", "Traceback", "Exception", "FAILED", "failed",
                                    "warning", "Warning", "def", "class", "function", "raise", "assert" };
    std::vector<llama_token> out;
    for (const char * w : words) {
        for (const std::string & text : { std::string(w), " " + std::string(w) }) {
            const std::vector<llama_token> t = model.tokenize(text, false, false);
            if (t.size() == 1) {  // a word split in pieces would mark generic pieces
                out.push_back(t[0]);
            }
        }
    }
    return out;
}

void llama_opt_session_attn_drop::drop_irrelevant_tool_spans(const std::vector<llama_token> & query) {
    const llama_opt_config & cfg = approx_.get();
    llama_opt_sparse_params params;
    params.threshold  = cfg.sparse_relevance_threshold;
    params.span       = cfg.sparse_attn_span;
    params.keep_edges = cfg.sparse_attn_keep_edges;
    params.budget     = cfg.sparse_attn_budget;
    const llama_opt_sparse_scorer scorer(params, cue_tokens(history_.ctx().model()));
    for (const llama_opt_span & tool : tool_spans_) {
        const uint32_t n = (uint32_t) (tool.second - tool.first);
        const auto spans = scorer.score(history_.tokens().data() + tool.first, n, query.data(), (uint32_t) query.size());
        for (const llama_opt_relevance_span & d : scorer.drops(spans, n)) {
            const size_t p0 = tool.first + d.start;
            const size_t p1 = std::min(p0 + d.length, history_.n_evaluated() > 0 ? history_.n_evaluated() - 1 : 0);
            if (p0 < p1) {
                history_.drop_kv(p0, p1);
                counters_.count(&llama_opt_stats::sparse_spans_dropped, 1);
                counters_.count(&llama_opt_stats::sparse_tokens_dropped, p1 - p0);
            }
        }
    }
}

void llama_opt_session_attn_drop::sync(const std::vector<llama_token> & tokens,
                                       const std::vector<llama_opt_span> & tool_spans) {
    size_t end = 0;
    for (const llama_opt_span & s : tool_spans) {
        if (s.first < end || s.first >= s.second || s.second > tokens.size()) {
            throw llama_opt_error(llama_opt_errc::invalid_argument,
                "tool spans must be non-empty [start, end) ranges of the tokens, sorted and disjoint; got [" +
                std::to_string(s.first) + ", " + std::to_string(s.second) + ") after one ending at " +
                std::to_string(end) + " (" + std::to_string(tokens.size()) + " tokens)");
        }
        end = s.second;
    }
    const std::vector<llama_token> & history = history_.tokens();
    size_t common = 0;
    while (common < history.size() && common < tokens.size() && history[common] == tokens[common]) {
        ++common;
    }
    // the marks already in the history were scored (or left unmarked) when they were appended
    const auto first = std::find_if(tool_spans.begin(), tool_spans.end(),
                                    [&](const llama_opt_span & s) { return s.second > common; });
    if (!approx_.get().sparse_attn_enabled || first == tool_spans.end()) {
        sync_.sync(tokens);
        return;
    }
    history_.ctx().model().check_tokens(tokens.data(), tokens.size());  // before the history changes
    history_.check_fits(tokens.size());
    auto piece = [&](size_t a, size_t b) {
        return std::vector<llama_token>(tokens.begin() + (std::ptrdiff_t) a, tokens.begin() + (std::ptrdiff_t) b);
    };
    size_t pos = std::min(common, first->first);
    sync_.sync(piece(0, pos));
    for (auto s = first; s != tool_spans.end(); ++s) {
        if (pos < s->first) {
            append(piece(pos, s->first), llama_opt_span_kind::text, /* score_tools */ false);
        }
        append(piece(s->first, s->second), llama_opt_span_kind::tool, false);
        pos = s->second;
    }
    if (pos < tokens.size()) {
        append(piece(pos, tokens.size()), llama_opt_span_kind::text, true);
    }
}

void llama_opt_session_attn_drop::append(const std::vector<llama_token> & tokens, llama_opt_span_kind kind,
                                         bool score_tools) {
    history_.ctx().model().check_tokens(tokens.data(), tokens.size());  // before anything is dropped
    history_.check_fits(history_.size() + tokens.size());
    const llama_opt_config & cfg   = approx_.get();
    const size_t             begin = history_.size();
    llama_opt_spans_subtract(tool_spans_, begin, SIZE_MAX);  // the history was cut since they were marked
    system_end_ = std::min(system_end_, begin);
    if (kind != llama_opt_span_kind::tool && !tokens.empty() && score_tools) {
        if (cfg.sparse_attn_enabled && !tool_spans_.empty()) {
            if (history_.n_evaluated() < history_.size()) {  // a fork's tail, a pending token: their KV first
                prefill_.prefill_or_cut_back(history_.size());
            }
            drop_irrelevant_tool_spans(tokens);
        }
        tool_spans_.clear();  // each tool result is scored once, against the query that follows it
    }
    llama_opt_attn_capture * capture = cfg.attn_prune_enabled ? history_.ctx().attn_capture() : nullptr;
    if (capture) {
        capture->arm();
    }
    llama_opt_finally([&] { prefill_.append(tokens); },
                      [&] {
                          if (capture) {
                              capture->disarm();
                          }
                      });
    if (kind == llama_opt_span_kind::system) {
        system_end_ = std::max(system_end_, history_.size());
    }
    if (kind == llama_opt_span_kind::tool && begin < history_.size()) {  // kept for a fork that turns sparse_attn on
        tool_spans_.emplace_back(begin, history_.size());  // two results in a row stay two
    }
    if (capture && capture->available() && !tokens.empty()) {
        prune_.prune_turn(begin, system_end_);
    }
}
