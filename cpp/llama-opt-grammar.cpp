#include "llama-opt-grammar.h"

#include "llama-grammar.h"  // llama.cpp's internal grammar and vocabulary (src/)
#include "llama-vocab.h"
#include "llama-opt-checksum.h"
#include "llama-opt-log.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <mutex>
#include <unordered_map>

namespace {

struct stopwatch {
    uint64_t & total;
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    ~stopwatch() {
        total += (uint64_t) std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
    }
};

uint64_t mix(uint64_t h, uint64_t v) {
    return llama_opt_checksum(&v, sizeof(v), h);
}

std::string llama_opt_utf8(int64_t cpt) {
    std::string s;
    if (cpt < 0x80) {
        s += (char) cpt;
    } else if (cpt < 0x800) {
        s += (char) (0xC0 | (cpt >> 6));
        s += (char) (0x80 | (cpt & 0x3F));
    } else if (cpt < 0x10000) {
        s += (char) (0xE0 | (cpt >> 12));
        s += (char) (0x80 | ((cpt >> 6) & 0x3F));
        s += (char) (0x80 | (cpt & 0x3F));
    } else {
        s += (char) (0xF0 | (cpt >> 18));
        s += (char) (0x80 | ((cpt >> 12) & 0x3F));
        s += (char) (0x80 | ((cpt >> 6) & 0x3F));
        s += (char) (0x80 | (cpt & 0x3F));
    }
    return s;
}

constexpr uint32_t unreachable = UINT32_MAX / 4;  // no expansion (yet): sums of two stay below UINT32_MAX

// The characters of the elements from `e` to the end of its alternative, each rule at its
// shortest expansion (a class and its ranges and alternatives are one character).
uint32_t rest_chars(const llama_grammar_element * e, const std::vector<uint32_t> & min_chars) {
    uint32_t n = 0;
    for (; e->type != LLAMA_GRETYPE_END && e->type != LLAMA_GRETYPE_ALT; ++e) {
        if (e->type == LLAMA_GRETYPE_RULE_REF) {
            n = std::min(n + min_chars[e->value], unreachable);
        } else if (e->type != LLAMA_GRETYPE_CHAR_RNG_UPPER && e->type != LLAMA_GRETYPE_CHAR_ALT) {
            n = std::min(n + 1, unreachable);
        }
    }
    return n;
}

// Each rule's shortest expansion, in characters: relaxed until nothing changes (lengths only
// shrink, and a recursive alternative never beats the one that ends the recursion).
std::vector<uint32_t> shortest_expansions(const llama_grammar_rules & rules) {
    std::vector<uint32_t> min_chars(rules.size(), unreachable);
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t r = 0; r < rules.size(); ++r) {
            const llama_grammar_element * e = rules[r].data();
            for (;;) {  // each alternative
                const uint32_t n = rest_chars(e, min_chars);
                if (n < min_chars[r]) {
                    min_chars[r] = n;
                    changed      = true;
                }
                while (e->type != LLAMA_GRETYPE_END && e->type != LLAMA_GRETYPE_ALT) {
                    ++e;
                }
                if (e->type == LLAMA_GRETYPE_END) {
                    break;
                }
                ++e;
            }
        }
    }
    return min_chars;
}

}  // namespace

llama_opt_grammar_vocab::llama_opt_grammar_vocab(const llama_vocab * vocab)
    : vocab_(vocab), n_tokens_((size_t) llama_vocab_n_tokens(vocab)), by_first_byte_(256), by_first_two_(256 * 257) {
    for (llama_token t = 0; t < (llama_token) n_tokens_; ++t) {
        const std::string & piece = vocab->token_to_piece(t);
        if (!piece.empty()) {
            by_first_byte_[(uint8_t) piece[0]].push_back(t);
            by_first_two_[(uint8_t) piece[0] * 257 + (piece.size() > 1 ? (uint8_t) piece[1] + 1 : 0)].push_back(t);
        }
        if (llama_vocab_is_eog(vocab, t)) {
            eog_.push_back(t);
        }
    }
}

llama_opt_grammar_vocab::token_list llama_opt_grammar_vocab::allowed(uint64_t state) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = allowed_.find(state);
    return it == allowed_.end() ? nullptr : it->second;
}

void llama_opt_grammar_vocab::remember_allowed(uint64_t state, token_list tokens) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (allowed_total_ + tokens->size() > (size_t{ 1 } << 24)) {  // 64 MiB at most; recomputed when needed
        allowed_.clear();
        allowed_total_ = 0;
    }
    allowed_total_ += tokens->size();
    allowed_[state] = std::move(tokens);
}

bool llama_opt_grammar_vocab::forced(uint64_t state, llama_token & token) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = forced_.find(state);
    if (it == forced_.end()) {
        return false;
    }
    token = it->second;
    return true;
}

void llama_opt_grammar_vocab::remember_forced(uint64_t state, llama_token token) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (forced_.size() >= (size_t{ 1 } << 20)) {
        forced_.clear();
    }
    forced_[state] = token;
}

llama_opt_grammar::llama_opt_grammar(std::shared_ptr<llama_opt_grammar_vocab> vocab, const std::string & gbnf,
                                     const std::string & root)
    : vocab_(std::move(vocab)), n_vocab_(vocab_->n_tokens()) {
    llama_opt_log_take_errors();
    grammar_ = llama_grammar_init_impl(vocab_->vocab(), gbnf.c_str(), root.c_str(), false, nullptr, 0, nullptr, 0);
    if (!grammar_) {
        const std::string why = llama_opt_log_take_errors();
        throw llama_opt_error(llama_opt_errc::grammar,
            "invalid grammar" + (why.empty() ? std::string() : ": " + why) +
            "\n(GBNF as in llama.cpp's grammars/README.md, with a '" + root + "' rule)", "grammar");
    }
    text_hash_ = llama_opt_checksum(gbnf.data(), gbnf.size(), llama_opt_checksum(root.data(), root.size()));
}

llama_opt_grammar::llama_opt_grammar(std::shared_ptr<llama_opt_grammar_vocab> vocab, llama_grammar * grammar,
                                     uint64_t text_hash)
    : vocab_(std::move(vocab)), grammar_(grammar), n_vocab_(vocab_->n_tokens()), text_hash_(text_hash) {}

llama_opt_grammar::~llama_opt_grammar() {
    llama_grammar_free_impl(grammar_);
}

uint64_t llama_opt_grammar::state_key() const {
    // elements are addressed by (rule, offset): the same in every object parsed from this text
    const llama_grammar_rules & rules = grammar_->rules;
    uint64_t h = text_hash_;
    for (const llama_grammar_stack & stack : grammar_->stacks) {
        h = mix(h, stack.size());
        for (const llama_grammar_element * e : stack) {
            for (size_t r = 0; r < rules.size(); ++r) {
                if (e >= rules[r].data() && e < rules[r].data() + rules[r].size()) {
                    h = mix(h, (r << 32) | (uint64_t) (e - rules[r].data()));
                    break;
                }
            }
        }
    }
    h = mix(h, grammar_->partial_utf8.value);
    return mix(h, (uint64_t) (int64_t) grammar_->partial_utf8.n_remain);
}

std::vector<llama_token> llama_opt_grammar::allowed(const llama_token * ids, size_t n) const {
    std::vector<llama_token_data> data(n);
    for (size_t i = 0; i < n; ++i) {
        data[i] = { ids[i], 0.0f, 0.0f };
    }
    llama_token_data_array cur = { data.data(), data.size(), -1, false };
    llama_grammar_apply_impl(*grammar_, &cur);
    std::vector<llama_token> out;
    for (const llama_token_data & d : data) {
        if (d.logit != -INFINITY) {
            out.push_back(d.id);
        }
    }
    return out;
}

// The one character every continuation starts with, or -1 when there are several (or the text
// may end here: end-of-generation is allowed then). Every character has a token (byte
// fallback), so several characters mean several allowed tokens.
static int64_t only_next_char(const llama_grammar & g) {
    if (g.partial_utf8.n_remain != 0) {
        return -1;  // inside a multi-byte character: not worth the bookkeeping
    }
    int64_t only = -1;
    for (const llama_grammar_stack & stack : g.stacks) {
        if (stack.empty()) {
            return -1;
        }
        const llama_grammar_element * e = stack.back();
        if (e->type != LLAMA_GRETYPE_CHAR || e[1].type == LLAMA_GRETYPE_CHAR_RNG_UPPER || e[1].type == LLAMA_GRETYPE_CHAR_ALT) {
            return -1;  // a class, a negated class, any character, or a token
        }
        if (only >= 0 && only != (int64_t) e->value) {
            return -1;
        }
        only = e->value;
    }
    return only;
}

// The bytes some continuation of `g` starts with, and whether the text may end here; false when
// that is not known (inside a multi-byte character, or a negated class, any character, a token).
static bool next_bytes(const llama_grammar & g, std::array<bool, 256> & bytes, bool & may_end) {
    if (g.partial_utf8.n_remain != 0) {
        return false;
    }
    for (const llama_grammar_stack & stack : g.stacks) {
        if (stack.empty()) {
            may_end = true;
            continue;
        }
        const llama_grammar_element * e = stack.back();
        if (e->type != LLAMA_GRETYPE_CHAR) {
            return false;
        }
        for (; e->type == LLAMA_GRETYPE_CHAR || e->type == LLAMA_GRETYPE_CHAR_ALT; ++e) {
            const uint32_t lo = e->value;
            const uint32_t hi = e[1].type == LLAMA_GRETYPE_CHAR_RNG_UPPER ? e[1].value : lo;
            for (uint32_t c = lo; c <= hi && c < 0x80; ++c) {
                bytes[c] = true;
            }
            if (hi >= 0x80) {  // first bytes of multi-byte characters in the range
                const uint8_t from = (uint8_t) llama_opt_utf8(std::max<uint32_t>(lo, 0x80))[0];
                const uint8_t to   = (uint8_t) llama_opt_utf8(hi)[0];
                for (uint32_t b = from; b <= to; ++b) {
                    bytes[b] = true;
                }
            }
            if (e[1].type == LLAMA_GRETYPE_CHAR_RNG_UPPER) {
                ++e;
            }
        }
    }
    return true;
}

// The tokens that may be allowed: those whose first two bytes some continuation starts with
// (the first byte alone after a multi-byte character or where what follows is not known), and
// end-of-generation tokens where the text may end; all tokens when the first byte is not known.
std::vector<llama_token> llama_opt_grammar::candidates() const {
    std::array<bool, 256> first{};
    bool may_end = false;
    if (!next_bytes(*grammar_, first, may_end)) {
        return all_tokens();
    }
    std::vector<llama_token> ids;
    auto take = [&](const std::vector<llama_token> & bucket) { ids.insert(ids.end(), bucket.begin(), bucket.end()); };
    for (int b = 0; b < 256; ++b) {
        if (!first[b]) {
            continue;
        }
        std::array<bool, 256> second{};
        bool ends_after = false;
        bool known      = b < 0x80;
        if (known) {
            llama_grammar * after = llama_grammar_clone_impl(*grammar_);
            llama_grammar_accept(after, (uint32_t) b);
            known = next_bytes(*after, second, ends_after);
            llama_grammar_free_impl(after);
        }
        if (!known) {
            take(vocab_->starting_with((uint8_t) b));
            continue;
        }
        take(vocab_->starting_with((uint8_t) b, -1));  // the one-byte tokens
        for (int b2 = 0; b2 < 256; ++b2) {
            if (second[b2] || b2 == 0) {  // llama.cpp's grammar reads a token's text up to a NUL byte
                take(vocab_->starting_with((uint8_t) b, b2));
            }
        }
    }
    if (may_end) {
        take(vocab_->eog());
    }
    return ids;
}

// ids before others: higher logit, then lower id (the order an argmax scan prefers)
static bool ranks_before(const float * logits, llama_token a, llama_token b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
}

std::vector<llama_token> llama_opt_grammar::ranked(const float * logits, size_t k) const {
    // one pass keeping the k best in order; once there are k, a block of logits none of which
    // beats the k-th is passed over with one vectorized comparison (equal ones rank after it)
    constexpr llama_token block = 64;
    std::vector<llama_token> top;
    top.reserve(k + 1);
    for (llama_token from = 0; from < n_vocab_; from += block) {
        const llama_token to = std::min(n_vocab_, from + block);
        if (top.size() == k) {
            const float bar   = logits[top.back()];
            int         above = 0;
            for (llama_token t = from; t < to; ++t) {
                above |= logits[t] > bar;
            }
            if (!above) {
                continue;
            }
        }
        for (llama_token t = from; t < to; ++t) {
            if (top.size() == k && !ranks_before(logits, t, top.back())) {
                continue;
            }
            auto at = std::upper_bound(top.begin(), top.end(), t,
                                       [logits](llama_token a, llama_token b) { return ranks_before(logits, a, b); });
            top.insert(at, t);
            if (top.size() > k) {
                top.pop_back();
            }
        }
    }
    return top;
}

// The token with the highest logit among `ok` (all allowed), -1 if there is none.
static llama_token best_among(const std::vector<llama_token> & ok, const float * logits) {
    llama_token best = -1;
    for (llama_token t : ok) {
        if (best < 0 || ranks_before(logits, t, best)) {
            best = t;
        }
    }
    return best;
}

// `ids` from the best, by logit
static std::vector<llama_token> by_rank(std::vector<llama_token> ids, const float * logits) {
    std::sort(ids.begin(), ids.end(), [logits](llama_token a, llama_token b) { return ranks_before(logits, a, b); });
    return ids;
}

llama_token llama_opt_grammar::best(const float * logits, bool full_mask) {
    stopwatch sw{ check_ns_ };
    llama_token best_allowed = -1;  // ignoring the budget
    if (full_mask) {
        const std::vector<llama_token> ids = all_tokens();
        const std::vector<llama_token> ok = allowed(ids.data(), ids.size());
        best_allowed = best_among(ok, logits);
        if (best_allowed < 0 || budget_ == no_budget || fits(best_allowed)) {
            return best_allowed;
        }
        const llama_token t = first_fitting(by_rank(ok, logits));
        budget_picks_ += t >= 0;
        return t >= 0 ? t : give_up_budget(best_allowed);
    }
    // the model usually wants what the grammar allows: try its favourites first, a few at a time
    const std::vector<llama_token> top = ranked(logits, 32);
    for (size_t i = 0; i < top.size(); i += 8) {
        const std::vector<llama_token> ok = allowed(top.data() + i, std::min<size_t>(8, top.size() - i));
        if (!ok.empty() && best_allowed < 0) {
            best_allowed = ok.front();
        }
        const llama_token t = first_fitting(ok);
        if (t >= 0) {
            budget_picks_ += t != best_allowed;
            return t;
        }
    }
    // otherwise the best of everything allowed here
    const llama_opt_grammar_vocab::token_list ok = allowed_here();
    if (best_allowed < 0) {
        best_allowed = best_among(*ok, logits);
        if (best_allowed < 0 || fits(best_allowed)) {
            return best_allowed;
        }
    }
    const llama_token t = first_fitting(by_rank(*ok, logits));
    budget_picks_ += t >= 0;
    return t >= 0 ? t : give_up_budget(best_allowed);
}

llama_token llama_opt_grammar::give_up_budget(llama_token pick) {
    budget_ = no_budget;  // the rule cannot close this output: no later step scans every allowed token again
    return pick;
}

void llama_opt_grammar::set_budget(size_t tokens) {
    budget_ = tokens;
}

uint32_t llama_opt_grammar::chars_to_end() {
    if (min_chars_.empty()) {
        min_chars_ = shortest_expansions(grammar_->rules);
    }
    uint32_t shortest = unreachable;
    for (const llama_grammar_stack & stack : grammar_->stacks) {  // each position still to finish its alternative
        uint32_t n = 0;
        for (const llama_grammar_element * e : stack) {
            n = std::min(n + rest_chars(e, min_chars_), unreachable);
        }
        shortest = std::min(shortest, n);
    }
    return shortest;
}

bool llama_opt_grammar::fits(llama_token token) {
    if (budget_ == no_budget || llama_vocab_is_eog(vocab_->vocab(), token)) {
        return true;
    }
    // taken on the grammar itself, then undone: a non-lazy grammar's state is its stacks and
    // partial character
    llama_grammar_stacks     stacks  = grammar_->stacks;
    const llama_partial_utf8 partial = grammar_->partial_utf8;
    llama_grammar_accept_impl(*grammar_, token);
    // a character left unfinished needs its remaining bytes first, possibly a token each
    const size_t to_end = (size_t) chars_to_end() + (size_t) std::max(0, grammar_->partial_utf8.n_remain);
    grammar_->stacks       = std::move(stacks);
    grammar_->partial_utf8 = partial;
    return to_end + 2 <= budget_;  // this token, the completion, the end of generation
}

llama_token llama_opt_grammar::first_fitting(const std::vector<llama_token> & ids) {
    for (llama_token t : ids) {
        if (fits(t)) {
            return t;
        }
    }
    return -1;
}

llama_opt_grammar_vocab::token_list llama_opt_grammar::allowed_here() {
    const uint64_t key = state_key();
    if (llama_opt_grammar_vocab::token_list known = vocab_->allowed(key)) {
        return known;
    }
    const std::vector<llama_token> ids = candidates();
    auto ok = std::make_shared<const std::vector<llama_token>>(allowed(ids.data(), ids.size()));
    vocab_->remember_allowed(key, ok);
    return ok;
}

std::vector<llama_token> llama_opt_grammar::all_tokens() const {
    std::vector<llama_token> ids(n_vocab_);
    for (llama_token t = 0; t < n_vocab_; ++t) {
        ids[t] = t;
    }
    return ids;
}

std::vector<llama_token_data> llama_opt_grammar::top_allowed(const float * logits, int32_t k, bool full_mask) {
    stopwatch sw{ check_ns_ };
    std::vector<llama_token_data> out;
    const auto take = [&](llama_token t) { out.push_back({ t, logits[t], 0.0f }); };
    if (k > 0 && !full_mask) {
        // the model's favourites first, as best() does: when its 256 best tokens hold k allowed
        // ones (that fit), those are the k best allowed, and the whole allowed set is not needed
        const std::vector<llama_token> top      = ranked(logits, 256);
        const std::vector<llama_token> favoured = allowed(top.data(), top.size());
        for (size_t i = 0; i < favoured.size() && out.size() < (size_t) k; ++i) {
            if (fits(favoured[i])) {
                take(favoured[i]);
            }
        }
        if (out.size() == (size_t) k) {
            budget_picks_ += out.back().id != favoured[k - 1];  // the set to sample from changed
            return out;
        }
        out.clear();
    }
    const std::vector<llama_token> all = full_mask ? all_tokens() : std::vector<llama_token>();
    std::vector<llama_token>       ok  = full_mask ? allowed(all.data(), all.size()) : *allowed_here();
    const size_t                   n   = k > 0 ? std::min(ok.size(), (size_t) k) : ok.size();
    // with a budget, the n best that fit are looked for among the best `checked` (top_k's, if more;
    // near the end of a string a few hundred thousand tokens are allowed and a handful fit: the
    // rest carry no probability worth a check); only those are put in order, not all allowed
    constexpr size_t checked = 1024;
    const size_t     scan    = std::min(ok.size(), k > 0 ? std::max(n, checked) : checked);
    const size_t     ordered = budget_ == no_budget ? n : scan;
    std::partial_sort(ok.begin(), ok.begin() + ordered, ok.end(),
                      [logits](llama_token a, llama_token b) { return ranks_before(logits, a, b); });
    if (budget_ != no_budget) {
        for (size_t i = 0; i < scan && out.size() < n; ++i) {
            if (fits(ok[i])) {
                take(ok[i]);
            }
        }
        if (out.empty()) {  // then the best that fits beyond them, as greedy takes it
            const llama_token t = first_fitting(by_rank({ ok.begin() + scan, ok.end() }, logits));
            if (t >= 0) {
                take(t);
            } else {
                give_up_budget(-1);
            }
        }
        if (!out.empty()) {
            budget_picks_ += out.size() < n || out.back().id != ok[n - 1];  // the set to sample from changed
            return out;
        }
    }
    for (size_t i = 0; i < n; ++i) {
        take(ok[i]);
    }
    return out;
}

llama_token llama_opt_grammar::forced() {
    stopwatch sw{ check_ns_ };
    const int64_t c = only_next_char(*grammar_);
    if (c < 0) {
        return -1;
    }
    const uint64_t key = state_key();
    llama_token    only;
    if (vocab_->forced(key, only)) {
        return only;
    }
    // only tokens starting with that character can be allowed; stop at the second one
    const std::vector<llama_token> & bucket = vocab_->starting_with((uint8_t) llama_opt_utf8(c)[0]);
    only = -2;
    for (size_t start = 0; start < bucket.size() && only != -1; start += 1024) {
        for (llama_token t : allowed(bucket.data() + start, std::min<size_t>(1024, bucket.size() - start))) {
            only = only == -2 ? t : -1;
        }
    }
    vocab_->remember_forced(key, only);
    return only;
}

std::vector<llama_token> llama_opt_grammar::forced_run(size_t max_tokens) {
    llama_opt_grammar        probe(vocab_, llama_grammar_clone_impl(*grammar_), text_hash_);
    std::vector<llama_token> run;
    for (llama_token t; run.size() < max_tokens && (t = probe.forced()) >= 0;) {
        probe.accept(t);
        run.push_back(t);
    }
    check_ns_ += probe.check_ns_;
    return run;
}

std::string llama_opt_grammar::forced_text(size_t max_chars) {
    stopwatch sw{ check_ns_ };
    llama_grammar * probe = llama_grammar_clone_impl(*grammar_);
    std::string text;
    for (size_t i = 0; i < max_chars; ++i) {
        const int64_t c = only_next_char(*probe);
        if (c < 0) {
            break;
        }
        llama_grammar_accept(probe, (uint32_t) c);
        text += llama_opt_utf8(c);
    }
    llama_grammar_free_impl(probe);
    return text;
}

bool llama_opt_grammar::allows(llama_token token) {
    stopwatch sw{ check_ns_ };
    return !allowed(&token, 1).empty();
}

void llama_opt_grammar::accept(llama_token token) {
    llama_grammar_accept_impl(*grammar_, token);
    if (budget_ != no_budget && budget_ > 0) {
        --budget_;
    }
}

llama_opt_skip_result llama_opt_schema_query_next(llama_opt_grammar & grammar) {
    const llama_token only = grammar.forced();
    llama_opt_skip_result result;
    result.can_skip     = only >= 0;
    result.forced_token = only >= 0 ? only : -1;
    result.dead_end     = only == -2;
    return result;
}

llama_opt_skip_sequence llama_opt_schema_query_sequence(llama_opt_grammar & grammar, uint32_t max_lookahead) {
    llama_opt_skip_sequence sequence;
    sequence.tokens = grammar.forced_run(max_lookahead);
    sequence.n_skip = (uint32_t) sequence.tokens.size();
    return sequence;
}
