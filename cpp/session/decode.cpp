#include "session/decode.h"

#include <algorithm>
#include <chrono>

llama_opt_session_decode::llama_opt_session_decode(llama_opt_session_history & history,
                                                   llama_opt_session_counters & counters,
                                                   llama_opt_session_prefill & prefill, llama_opt_session_room & room)
    : history_(history),
      counters_(counters),
      prefill_(prefill),
      room_(room),
      sampler_(history.ctx().model(), history.ctx().settings().config) {}

void llama_opt_session_decode::set_grammar(const std::string & gbnf, uint32_t max_tokens,
                                           const std::vector<llama_opt_grammar_trigger> & triggers,
                                           const std::string & prefill) {
    sampler_.set_grammar(gbnf, max_tokens, triggers, prefill);
    output_budget_ = max_tokens;
}

void llama_opt_session_decode::set_sampling(const llama_opt_sampling & sampling) {
    if (sampling.logprobs != -1) {
        llama_opt_check_top_logprobs(sampling.logprobs);
    }
    sampler_.set_sampling(sampling);
    logprobs_ = sampling.logprobs;
}

llama_token llama_opt_session_decode::next_token() {
    const llama_opt_context & ctx = history_.ctx();
    last_logprob_.reset();
    if (history_.room() == 0) {
        throw llama_opt_error(llama_opt_errc::context_overflow,
            "the session fills the context (n_ctx=" + std::to_string(ctx.n_ctx()) + ")", "n_ctx");
    }
    if (history_.empty()) {
        throw llama_opt_error(llama_opt_errc::invalid_argument,
            "the session is empty: append a prompt before generating");
    }
    if (!generating_) {
        generating_   = true;
        output_begin_ = history_.size();
        room_.reserve_output_room(output_budget_);
        sampler_.start_generation(history_.tokens());
    }
    // (with logprobs, every token needs the logits it is picked from: none is taken without them)
    if (sampler_.constrained() && ctx.settings().config.schema_skip_enabled && history_.n_evaluated() > 0 &&
        logprobs_ < 0) {
        const llama_token inferred = sampler_.next_inferred();
        if (inferred == -2) {
            return -1;  // the grammar allows nothing more
        }
        if (inferred >= 0) {  // the grammar leaves one choice: no logits, no sampling for it
            return take_inferred(inferred);
        }
    }
    compute_pending();  // the pending sampled token: one decode step, not a (canonical) prefill
    prefill_.ensure_logits(&llama_opt_stats::tokens_prefilled);

    const llama_token token = sampler_.pick(history_.logits());
    if (token < 0) {
        return -1;  // the grammar allows nothing more
    }
    if (sampler_.constrained()) {
        counters_.count(&llama_opt_stats::schema_tokens_total, 1);
    }
    if (logprobs_ >= 0) {  // (before take: a confirmed draft token brings the logits after it)
        last_logprob_ = llama_opt_logprob_of(history_.logits().data(), (int32_t) ctx.model().n_vocab(), token, logprobs_);
    }
    return take(token);
}

llama_token llama_opt_session_decode::take(llama_token token) {
    sampler_.accept(token);
    history_.push(token);
    if (history_.draft_active()) {
        const bool confirmed = history_.confirm_draft(token);  // if so, its KV came with the check
        history_.ctx().memo_gate().compared(draft_match_, ++draft_place_, confirmed);
        if (confirmed) {
            counters_.count(&llama_opt_stats::memo_tokens_skipped, 1);
            if (history_.draft_shared()) {
                counters_.count(&llama_opt_stats::memo_shared_tokens_skipped, 1);
            }
        }
    }
    counters_.count(&llama_opt_stats::tokens_generated, 1);
    return token;
}

// A token the grammar decided: it joins the history without logits or sampling; its KV is
// computed before the next real step (compute_pending).
llama_token llama_opt_session_decode::take_inferred(llama_token token) {
    take(token);
    counters_.count(&llama_opt_stats::schema_tokens_total, 1);
    counters_.count(&llama_opt_stats::schema_tokens_inferred, 1);
    counters_.count(&llama_opt_stats::schema_tokens_skipped, 1);
    return token;
}

void llama_opt_session_decode::compute_pending() {
    // generated tokens without KV yet: the last sampled one, and any the grammar forced after it
    if (history_.n_evaluated() == 0 || history_.n_evaluated() >= history_.size() || !history_.logits_current()) {
        return;
    }
    if (generating_) {
        room_.move_answer_down(output_begin_, output_budget_);
    }
    if (generating_ && history_.n_evaluated() + 1 == history_.size() && check_draft()) {
        return;
    }
    const llama_opt_config & cfg = history_.ctx().settings().config;
    if (!cfg.schema_skip_batch && !cfg.schema_jump_forward) {
        // as if nothing had been skipped (bitwise the same KV): batches small enough that each
        // row computes like a one-token step (patches/0006), without logits but for the last
        while (history_.size() - history_.n_evaluated() > LLAMA_OPT_ROW_INVARIANT_BATCH) {
            const size_t stop = history_.n_evaluated() + LLAMA_OPT_ROW_INVARIANT_BATCH;
            history_.compute(history_.n_evaluated(), stop, &llama_opt_stats::tokens_decoded, true, /* logits */ false);
            history_.computed(stop);
        }
    }
    const bool one_row = history_.size() - history_.n_evaluated() == 1;
    const auto start   = std::chrono::steady_clock::now();
    history_.compute(history_.n_evaluated(), history_.size(), &llama_opt_stats::tokens_decoded, true);
    // a step's time: what a drafted token saves when it is confirmed (methods/memo-gate)
    if (one_row && generating_ && history_.ctx().settings().config.memo_gate) {
        history_.ctx().memo_gate().step((uint64_t) std::chrono::duration_cast<std::chrono::microseconds>(
            std::chrono::steady_clock::now() - start).count());
    }
    history_.computed(history_.size());
}

std::optional<llama_opt_memo_draft> llama_opt_session_decode::find_draft() const {
    const llama_opt_config & cfg = history_.ctx().settings().config;
    if (!cfg.memo_enabled) {
        return std::nullopt;
    }
    const std::vector<llama_token> & tokens = history_.tokens();
    auto max_tokens = (uint32_t) std::min<size_t>(cfg.memo_draft_max, history_.room());
    if (output_budget_ > 0) {
        // row j of the check gives the logits of the output's token (generated + 1 + j): none past the budget
        const size_t generated = tokens.size() - std::min(output_begin_, tokens.size());
        max_tokens = (uint32_t) std::min<size_t>(max_tokens, output_budget_ > generated + 1 ? output_budget_ - generated - 1 : 0);
    }
    if (max_tokens == 0) {
        return llama_opt_memo_draft{};  // looked: no room for one
    }
    llama_opt_memo_draft draft = llama_opt_memo_find(tokens.data(), tokens.size(), max_tokens);
    if (cfg.memo_shared) {
        history_.ctx().memo_outputs().improve(tokens.data(), tokens.size(), max_tokens, draft);
    }
    if (!draft.tokens.empty() && cfg.memo_gate) {
        // the prefix of the draft that pays here (methods/memo-gate: confirmed more often than rows cost)
        draft.tokens.resize(history_.ctx().memo_gate().draft_length(draft.match, (uint32_t) draft.tokens.size()));
        if (draft.tokens.empty()) {
            return std::nullopt;
        }
    }
    return draft;
}

void llama_opt_session_decode::count_draft_hit(bool shared) {
    counters_.count(&llama_opt_stats::memo_hits, 1);
    if (shared) {
        counters_.count(&llama_opt_stats::memo_shared_hits, 1);
    }
}

// memo (methods/memo.h): when the history repeats itself, the pending token and a draft of what
// followed earlier go through one batch, whose rows compute bit for bit like one-token decode
// steps (patches/0006): row i holds the logits after i drafted tokens. Sampling then confirms
// drafted tokens one by one (take) as long as it picks them, exactly as plain decoding would have
// gone on.
bool llama_opt_session_decode::check_draft() {
    llama_opt_context &                 ctx   = history_.ctx();
    std::optional<llama_opt_memo_draft> found = find_draft();
    if (!found) {
        return false;
    }
    counters_.count(&llama_opt_stats::memo_lookups, 1);
    llama_opt_memo_draft & draft = *found;
    if (draft.tokens.empty()) {
        return false;
    }
    std::vector<llama_opt_row> rows;
    add_rows(draft, rows);
    llama_opt_work work;
    if (!ctx.compute_rows(rows, history_.draft_rows(), work)) {
        return false;  // no room for the draft: a plain step
    }
    counters_.count_work(&llama_opt_stats::tokens_decoded, work);
    count_draft_hit(draft.shared);
    // (the pending row's part of the pass: a step)
    ctx.memo_gate().checked(draft.match, draft.tokens.size(), (double) work.us - ctx.memo_gate().step_us());
    start_draft(std::move(draft));
    history_.computed(history_.size());
    history_.take_logits(history_.draft_rows().data());
    return true;
}

void llama_opt_session_decode::start_draft(llama_opt_memo_draft draft) {
    draft_match_ = draft.match;
    draft_place_ = 0;
    history_.start_draft(std::move(draft.tokens), draft.shared);
}

void llama_opt_session_decode::add_rows(const llama_opt_memo_draft & draft, std::vector<llama_opt_row> & rows) const {
    const size_t n = history_.n_evaluated();
    rows.push_back({ history_.seq(), n, history_.tokens().back() });
    for (size_t i = 0; i < draft.tokens.size(); ++i) {
        rows.push_back({ history_.seq(), n + 1 + i, draft.tokens[i] });
    }
}

bool llama_opt_session_decode::step_rows(std::vector<llama_opt_row> & rows,
                                         std::optional<llama_opt_memo_draft> & draft) const {
    if (!generating_ || history_.n_evaluated() == 0 || history_.n_evaluated() + 1 != history_.size() ||
        !history_.logits_current() || sampler_.has_inferred() || history_.room() == 0) {
        return false;  // (a grammar that may force the next token: the row's logits may go unused, its KV not)
    }
    draft = find_draft();  // what check_draft() would check in the session's own step
    add_rows(draft ? *draft : llama_opt_memo_draft{}, rows);
    return true;
}

void llama_opt_session_decode::take_rows(const float * logits, std::optional<llama_opt_memo_draft> found,
                                         uint64_t us) {
    const size_t         n_vocab = history_.ctx().model().n_vocab();
    llama_opt_memo_draft draft   = found ? std::move(*found) : llama_opt_memo_draft{};
    const size_t         n_rows  = 1 + draft.tokens.size();
    // the context counted the batch's tokens, its one pass and its time
    counters_.count_share(&llama_opt_stats::tokens_decoded, { n_rows, 1, us });
    if (found) {  // as check_draft() counts its step
        counters_.count(&llama_opt_stats::memo_lookups, 1);
    }
    if (!draft.tokens.empty()) {
        count_draft_hit(draft.shared);
        history_.ctx().memo_gate().checked(draft.match, draft.tokens.size(),
                                           (double) us * draft.tokens.size() / n_rows);  // its rows' share
        history_.draft_rows().assign(logits, logits + n_rows * n_vocab);
        start_draft(std::move(draft));
    }
    history_.computed(history_.size());
    history_.take_logits(logits);
}

void llama_opt_session_decode::prefetch_steps(llama_opt_context & ctx,
                                              const std::vector<llama_opt_session_decode *> & decoders) {
    std::vector<llama_opt_session_decode *> takers;
    std::vector<std::optional<llama_opt_memo_draft>> drafts;  // each taker's draft (its rows after the first)
    std::vector<size_t>                     first_row;  // each taker's first row
    std::vector<llama_opt_row>              rows;
    std::vector<float>                      logits;
    const size_t n_vocab = ctx.model().n_vocab();
    auto flush = [&] {
        llama_opt_work work;
        if (takers.size() > 1 && ctx.compute_rows(rows, logits, work)) {  // one step alone: its own is the same
            ctx.count_batch(work);  // the whole batch, once (each session keeps its share apart: take_rows)
            for (size_t i = 0; i < takers.size(); ++i) {
                const size_t n_rows = 1 + (drafts[i] ? drafts[i]->tokens.size() : 0);
                takers[i]->take_rows(logits.data() + first_row[i] * n_vocab, std::move(drafts[i]),
                                     work.us * n_rows / rows.size());
            }
        }
        takers.clear();
        drafts.clear();
        first_row.clear();
        rows.clear();
    };
    for (llama_opt_session_decode * d : decoders) {
        std::vector<llama_opt_row>          own;
        std::optional<llama_opt_memo_draft> draft;
        if (!d->step_rows(own, draft)) {
            continue;
        }
        if (rows.size() + own.size() > LLAMA_OPT_ROW_INVARIANT_BATCH) {
            flush();  // (a draft is at most LLAMA_OPT_MEMO_MATCH_MAX tokens: one step always fits)
        }
        takers.push_back(d);
        drafts.push_back(std::move(draft));
        first_row.push_back(rows.size());
        rows.insert(rows.end(), own.begin(), own.end());
    }
    flush();
}

void llama_opt_session_decode::publish_output() {
    const llama_opt_config & cfg    = history_.ctx().settings().config;
    const auto &             tokens = history_.tokens();
    const size_t             begin  = std::min(output_begin_, tokens.size());
    if (generating_ && cfg.memo_enabled && cfg.memo_shared) {
        history_.ctx().memo_outputs().add(tokens.data(), begin, tokens.data() + begin, tokens.size() - begin);
    }
}

void llama_opt_session_decode::end_turn(bool open) {
    history_.drop_draft();  // the generation is over: its unconfirmed draft's cells are free again
    history_.release_draft();
    if (open) {
        publish_output();
    }
    generating_    = false;  // logits() after the turn computes the pending token alone
    output_budget_ = 0;      // the next generation passes its own (set_grammar)
    if (sampler_.has_grammar()) {  // the generation it constrained (or waited to) is over
        const llama_opt_sampler::grammar_report report = sampler_.end_generation();
        counters_.count(&llama_opt_stats::schema_check_us, report.check_us);
        counters_.count(&llama_opt_stats::schema_budget_picks, report.budget_picks);
    }
}
