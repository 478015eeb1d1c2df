#include "session/session.h"

using lock_t = std::lock_guard<std::recursive_mutex>;

std::shared_ptr<llama_opt_session> llama_opt_session::open(std::shared_ptr<llama_opt_context> ctx) {
    lock_t lock(ctx->mutex());
    auto session = std::make_shared<llama_opt_session>(ctx);
    session->history_.attach(ctx->memory().acquire_seq(session));
    return session;
}

llama_opt_session::llama_opt_session(std::shared_ptr<llama_opt_context> ctx)
    : ctx_(std::move(ctx)),
      counters_(*ctx_),
      approx_(*ctx_),
      history_(*ctx_, counters_),
      reuse_(history_, counters_),
      room_(history_, reuse_),
      prefill_(history_, counters_, approx_, reuse_, room_),
      sync_(history_, counters_, prefill_),
      attn_prune_(history_, counters_, approx_, prefill_),
      attn_drop_(history_, counters_, approx_, prefill_, sync_, attn_prune_),
      decode_(history_, counters_, prefill_, room_) {
    history_.follow_cuts([this](size_t pos) { attn_prune_.forget_from(pos); });
}

llama_opt_session::~llama_opt_session() {
    close();
}

bool llama_opt_session::closed() const {
    return closed_ || evicted_ || ctx_->closed();
}

void llama_opt_session::check_open() const {
    if (evicted_) {
        throw llama_opt_error(llama_opt_errc::session_evicted,
            "this session was idle when the KV cache ran out of room and its KV was evicted; open a new session "
            "(and sync it to the same tokens), or create the Context with a larger n_ctx");
    }
    if (closed()) {
        throw llama_opt_error(llama_opt_errc::session_closed,
            "this session is closed; open a new one with context.session()");
    }
}

void llama_opt_session::close() {
    lock_t lock(ctx_->mutex());
    if (seq() >= 0 && !closed()) {  // seq() < 0: open() found no sequence for it
        history_.drop_draft();
        if (ctx_->memory().persist()) {
            reuse_.save_on_leaving();
        }
        ctx_->memory().release_seq(seq(), this);
    }
    closed_ = true;
}

void llama_opt_session::discard() {
    lock_t lock(ctx_->mutex());
    if (seq() >= 0 && !closed()) {
        history_.drop_draft();
        reuse_.cancel_write_behind();
        ctx_->memory().release_seq(seq(), this, /* keep_blocks */ false);
    }
    closed_ = true;
}

void llama_opt_session::on_evicted() {
    evicted_ = true;
    history_.lose_kv();
}

void llama_opt_session::on_kv_leaving() {
    if (!closed()) {
        reuse_.save_on_leaving();
    }
}

void llama_opt_session::append(const std::vector<llama_token> & tokens) {
    lock_t lock(ctx_->mutex());
    check_open();
    prefill_.append(tokens);
}

void llama_opt_session::append(const std::vector<llama_token> & tokens, llama_opt_span_kind kind) {
    lock_t lock(ctx_->mutex());
    check_open();
    attn_drop_.append(tokens, kind);
}

void llama_opt_session::drop_span(size_t p0, size_t p1) {
    lock_t lock(ctx_->mutex());
    check_open();
    attn_drop_.drop_span(p0, p1);
}

void llama_opt_session::set_tier2(const llama_opt_config & config) {
    lock_t lock(ctx_->mutex());
    check_open();
    approx_.set(config);
}

std::vector<std::pair<size_t, size_t>> llama_opt_session::holes() const {
    lock_t lock(ctx_->mutex());
    return history_.holes();
}

size_t llama_opt_session::n_cold() const {
    lock_t lock(ctx_->mutex());
    return attn_prune_.n_cold();
}

llama_opt_attn_probe llama_opt_session::attention_probe() {
    lock_t lock(ctx_->mutex());
    check_open();
    return attn_prune_.probe();
}

void llama_opt_session::sync(const std::vector<llama_token> & tokens) {
    lock_t lock(ctx_->mutex());
    check_open();
    sync_.sync(tokens);
}

void llama_opt_session::sync(const std::vector<llama_token> & tokens, const std::vector<std::pair<size_t, size_t>> & tool_spans) {
    lock_t lock(ctx_->mutex());
    check_open();
    attn_drop_.sync(tokens, tool_spans);
}

std::vector<llama_opt_token_logprob> llama_opt_session::score(const std::vector<llama_token> & tokens, int32_t top_n) {
    lock_t lock(ctx_->mutex());
    check_open();
    llama_opt_check_top_logprobs(top_n);
    const auto n_vocab = (int32_t) ctx_->model().n_vocab();
    std::vector<llama_opt_token_logprob> out;
    out.reserve(tokens.empty() ? 0 : tokens.size() - 1);
    prefill_.compute_afresh(tokens, [&](size_t pos, const float * logits) {
        if (pos + 1 < tokens.size()) {  // (the last row's logits are the next token's, not the prompt's)
            out.push_back(llama_opt_logprob_of(logits, n_vocab, tokens[pos + 1], top_n));
        }
    });
    return out;
}

std::shared_ptr<llama_opt_session> llama_opt_session::fork() {
    lock_t lock(ctx_->mutex());
    check_open();
    auto other = open(ctx_);
    history_.fork_to(other->history_);
    reuse_.share_blocks_with(other->seq());
    reuse_.copy_write_behind_to(other->reuse_);
    approx_.copy_to(other->approx_);
    attn_drop_.copy_marks_to(other->attn_drop_);
    return other;
}

size_t llama_opt_session::save() {
    lock_t lock(ctx_->mutex());
    check_open();
    if (!ctx_->memory().persist()) {
        throw llama_opt_error(llama_opt_errc::invalid_argument,
            "the persistent KV cache is off: create the Context with OptConfig(persist_enabled=True) "
            "(or LLAMA_OPT_PERSIST_ENABLED=1)", "persist_enabled");
    }
    return reuse_.save();
}

void llama_opt_session::set_sampling(const llama_opt_sampling & sampling) {
    lock_t lock(ctx_->mutex());
    decode_.set_sampling(sampling);
}

void llama_opt_session::set_grammar(const std::string & gbnf, uint32_t max_tokens,
                                    const std::vector<llama_opt_grammar_trigger> & triggers,
                                    const std::string & prefill) {
    lock_t lock(ctx_->mutex());
    decode_.set_grammar(gbnf, max_tokens, triggers, prefill);
}

llama_token llama_opt_session::next_token() {
    lock_t lock(ctx_->mutex());
    check_open();
    return decode_.next_token();
}

llama_opt_step llama_opt_session::step() {
    lock_t lock(ctx_->mutex());
    llama_opt_step s;
    s.token = next_token();
    if (s.token >= 0) {
        s.eog   = ctx_->model().is_eog(s.token);
        s.piece = ctx_->model().token_piece(s.token, false);
        s.logprob = decode_.last_logprob();
    }
    s.room = room();
    return s;
}

void llama_opt_session::prefetch_steps(const std::vector<std::shared_ptr<llama_opt_session>> & sessions) {
    if (sessions.empty()) {
        return;
    }
    llama_opt_context & ctx = *sessions.front()->ctx_;
    lock_t lock(ctx.mutex());
    std::vector<llama_opt_session_decode *> decoders;
    for (const auto & s : sessions) {
        if (s->ctx_.get() != &ctx) {
            throw llama_opt_error(llama_opt_errc::invalid_argument, "prefetch_steps: the sessions belong to different contexts");
        }
        if (!s->closed()) {
            decoders.push_back(&s->decode_);
        }
    }
    llama_opt_session_decode::prefetch_steps(ctx, decoders);
}

void llama_opt_session::end_turn() {
    lock_t lock(ctx_->mutex());
    decode_.end_turn(/* open */ !closed());
    const llama_opt_stats turn = counters_.end_turn();
    if (ctx_->settings().config.stats_enabled) {
        turn.print();
    }
}

std::vector<llama_token> llama_opt_session::tokens() const {
    lock_t lock(ctx_->mutex());
    return history_.tokens();
}

std::string llama_opt_session::invariant_violation() const {
    lock_t lock(ctx_->mutex());
    return closed() ? "" : history_.invariant_violation();
}

std::vector<float> llama_opt_session::logits() {
    lock_t lock(ctx_->mutex());
    check_open();
    decode_.compute_pending();  // peeking must not change how generation goes on
    prefill_.ensure_logits(&llama_opt_stats::tokens_prefilled);
    return history_.logits();
}

llama_opt_stats llama_opt_session::stats() const {
    llama_opt_stats s = counters_.stats();
    reuse_.add_write_behind_counts(s);  // what the background writer did for this session so far
    return s;
}
