#include "session/sampler.h"

#include "base/argmax.h"
#include "methods/grammar.h"

#include <cctype>

llama_opt_sampler::llama_opt_sampler(const llama_opt_model & model, const llama_opt_config & config)
    : model_(model), config_(config) {
    set_sampling(llama_opt_sampling());
}

llama_opt_sampler::~llama_opt_sampler() {
    llama_sampler_free(chain_);
}

void llama_opt_sampler::set_sampling(const llama_opt_sampling & s) {
    auto adjust = std::make_unique<llama_opt_logit_adjust>((int32_t) model_.n_vocab(), s.logit_bias, s.penalties);
    llama_sampler * chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
    if (s.temperature <= 0.0f) {
        llama_sampler_chain_add(chain, llama_sampler_init_greedy());
    } else {
        if (s.top_k > 0) {
            llama_sampler_chain_add(chain, llama_sampler_init_top_k(s.top_k));
        }
        if (s.top_p < 1.0f) {
            llama_sampler_chain_add(chain, llama_sampler_init_top_p(s.top_p, 1));
        }
        if (s.min_p > 0.0f) {
            llama_sampler_chain_add(chain, llama_sampler_init_min_p(s.min_p, 1));
        }
        llama_sampler_chain_add(chain, llama_sampler_init_temp(s.temperature));
        llama_sampler_chain_add(chain, llama_sampler_init_dist(s.seed));
    }
    llama_sampler_free(chain_);
    chain_  = chain;
    greedy_ = s.temperature <= 0.0f;
    top_k_  = s.top_k;
    adjust_ = std::move(adjust);
}

void llama_opt_sampler::set_grammar(const std::string & gbnf, uint32_t max_tokens,
                                    const std::vector<llama_opt_grammar_trigger> & triggers,
                                    const std::string & prefill) {
    if (gbnf.empty() && !triggers.empty()) {
        throw llama_opt_error(llama_opt_errc::grammar, "grammar triggers without a grammar to start");
    }
    if (!prefill.empty() && (gbnf.empty() || !triggers.empty())) {
        throw llama_opt_error(llama_opt_errc::invalid_argument,
                              "a grammar prefill is for a grammar applied from the output's start (not a lazy one)");
    }
    auto awaiting = triggers.empty() ? nullptr : std::make_unique<llama_opt_grammar_trigger_watch>(triggers);
    auto grammar  = gbnf.empty() ? nullptr : std::make_unique<llama_opt_grammar>(model_.grammar_vocab(), gbnf);
    if (!prefill.empty()) {
        prefill_grammar(*grammar, prefill);
    }
    grammar_   = std::move(grammar);
    awaiting_  = std::move(awaiting);
    budget_    = config_.schema_fit_max_tokens ? max_tokens : 0;
    n_awaited_ = 0;
    dead_end_  = false;
    inferred_queue_.clear();
    if (grammar_ && !awaiting_ && budget_ > 0) {
        grammar_->set_budget(budget_);
    }
}

llama_opt_sampler::grammar_report llama_opt_sampler::end_generation() {
    grammar_report report;
    if (grammar_) {
        report = { grammar_->check_ns() / 1000, grammar_->budget_picks() };
    }
    grammar_.reset();
    awaiting_.reset();
    inferred_queue_.clear();
    return report;
}

llama_token llama_opt_sampler::pick(const std::vector<float> & raw) {
    const float * logits = adjust_->apply(raw);
    if (constrained()) {
        if (dead_end_) {
            return -1;
        }
        return greedy_ ? grammar_->best(logits, config_.schema_full_mask) : sample_allowed(logits);
    }
    if (greedy_) {
        // what llama_sampler_init_greedy picks (the first maximum), without a 262k-entry array
        return (llama_token) llama_opt_first_max(logits, raw.size());
    }
    candidates_.resize(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) {
        candidates_[i] = { (llama_token) i, logits[i], 0.0f };
    }
    llama_token_data_array cur = { candidates_.data(), candidates_.size(), -1, false };
    llama_sampler_apply(chain_, &cur);
    return cur.data[cur.selected].id;
}

void llama_opt_sampler::accept(llama_token token) {
    if (awaiting_) {
        watch_trigger(token);
    } else if (grammar_) {
        grammar_->accept(token);
    }
    adjust_->accept(token);
    llama_sampler_accept(chain_, token);
}

// As llama.cpp's lazy grammar sampler: the grammar takes the text from the trigger on (the
// tokens that overlap it, the first one in part); its budget is what the output has left.
void llama_opt_sampler::watch_trigger(llama_token token) {
    ++n_awaited_;
    std::vector<llama_opt_token_text> start;
    if (!awaiting_->fires(token, model_.token_piece(token, true), start)) {
        return;
    }
    awaiting_.reset();
    for (const llama_opt_token_text & t : start) {
        if (!grammar_->accept_text(t.token, t.text)) {
            dead_end_ = true;  // a trigger the grammar does not start with (llama.cpp's sampler throws)
            return;
        }
    }
    if (budget_ > 0) {
        grammar_->set_budget(budget_ > n_awaited_ ? budget_ - n_awaited_ : 1);
    }
}

// As llama.cpp's common_sampler_init feeds a chat format's grammar the generation prompt (the
// template's end of the prompt, which its grammar's root starts with): the text's tokens, less a
// leading space some tokenizers put before a first special token. No budget is spent.
void llama_opt_sampler::prefill_grammar(llama_opt_grammar & grammar, const std::string & text) const {
    const std::vector<llama_token> tokens = model_.tokenize(text, false, true);
    for (size_t i = 0; i < tokens.size(); ++i) {
        const std::string piece = model_.token_piece(tokens[i], true);
        if (i == 0 && !piece.empty() && std::isspace((unsigned char) piece[0]) && !std::isspace((unsigned char) text[0])) {
            continue;
        }
        if (!grammar.accept_text(tokens[i], piece)) {
            throw llama_opt_error(llama_opt_errc::grammar, "the grammar does not start with its prefill '" + text +
                                  "': give a grammar whose root starts with that text, or no prefill", "grammar");
        }
    }
}

// Runs are queued: the tokens forced one after another (exact), or with jump-forward a forced
// string's own tokens.
llama_token llama_opt_sampler::next_inferred() {
    if (dead_end_) {
        return -2;
    }
    if (inferred_queue_.empty()) {
        queue_jump_forward();
    }
    if (inferred_queue_.empty()) {
        const llama_opt_skip_result next = llama_opt_schema_query_next(*grammar_);
        if (!next.can_skip) {
            return next.dead_end ? -2 : -1;
        }
        const std::vector<llama_token> run = llama_opt_schema_query_sequence(*grammar_, 64).tokens;
        inferred_queue_.assign(run.rbegin(), run.rend());  // popped from the back
    }
    const llama_token token = inferred_queue_.back();
    inferred_queue_.pop_back();
    if (!grammar_->allows(token)) {  // a string's tokenization the grammar does not take
        inferred_queue_.clear();
        return -1;
    }
    return token;
}

// Jump-forward (schema_jump_forward, opt-in): when the grammar forces a whole string, it is
// tokenized as text and taken token by token without forward passes, except its last token,
// which a longer token could still absorb together with what follows. The tokens are the
// string's own tokenization, which may differ from what the model would have produced.
void llama_opt_sampler::queue_jump_forward() {
    if (!config_.schema_jump_forward) {
        return;
    }
    const std::string text = grammar_->forced_text(256);
    if (text.empty()) {
        return;
    }
    std::vector<llama_token> tokens = model_.tokenize(text, false, false);
    if (tokens.size() < 2 || model_.detokenize(tokens, false, false) != text) {
        return;
    }
    tokens.pop_back();
    inferred_queue_.assign(tokens.rbegin(), tokens.rend());  // popped from the back
}

// Sampling under a grammar: the allowed tokens (the top_k best of them, when top_k is on) go
// through the sampler chain, as masking the vocabulary first would give.
llama_token llama_opt_sampler::sample_allowed(const float * logits) {
    candidates_ = grammar_->top_allowed(logits, top_k_, config_.schema_full_mask);
    if (candidates_.empty()) {
        return -1;
    }
    llama_token_data_array cur = { candidates_.data(), candidates_.size(), -1, true };
    llama_sampler_apply(chain_, &cur);
    return cur.data[cur.selected].id;
}
