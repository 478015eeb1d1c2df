#include "methods/grammar.h"

#include "llama-grammar.h"  // llama.cpp's internal grammar (src/)
#include "base/checksum.h"
#include "methods/grammar-chars.h"
#include "engine/log.h"
#include "base/types.h"

#include <array>
#include <cmath>

static uint64_t mix(uint64_t h, uint64_t v) {
    return llama_opt_checksum(&v, sizeof(v), h);
}

llama_opt_grammar::llama_opt_grammar(std::shared_ptr<llama_opt_grammar_vocab> vocab, const std::string & gbnf,
                                     const std::string & root)
    : llama_opt_grammar(vocab, parse(*vocab, gbnf, root),
                        llama_opt_checksum(gbnf.data(), gbnf.size(), llama_opt_checksum(root.data(), root.size()))) {}

llama_opt_grammar::llama_opt_grammar(std::shared_ptr<llama_opt_grammar_vocab> vocab, llama_grammar * grammar,
                                     uint64_t text_hash)
    : vocab_(std::move(vocab)), grammar_(grammar), n_vocab_(vocab_->n_tokens()), text_hash_(text_hash),
      budget_(*grammar, vocab_->vocab()) {}

llama_grammar * llama_opt_grammar::parse(const llama_opt_grammar_vocab & vocab, const std::string & gbnf,
                                         const std::string & root) {
    llama_opt_log_take_errors();
    llama_grammar * grammar = llama_grammar_init_impl(vocab.vocab(), gbnf.c_str(), root.c_str(), false, nullptr, 0, nullptr, 0);
    if (!grammar) {
        const std::string why = llama_opt_log_take_errors();
        throw llama_opt_error(llama_opt_errc::grammar,
            "invalid grammar" + (why.empty() ? std::string() : ": " + why) +
            "\n(GBNF as in llama.cpp's grammars/README.md, with a '" + root + "' rule)", "grammar");
    }
    return grammar;
}

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

// The tokens that may be allowed: those whose first two bytes some continuation starts with
// (the first byte alone after a multi-byte character or where what follows is not known), and
// end-of-generation tokens where the text may end; all tokens when the first byte is not known.
std::vector<llama_token> llama_opt_grammar::candidates() const {
    std::array<bool, 256> first{};
    bool may_end = false;
    if (!llama_opt_grammar_next_bytes(*grammar_, first, may_end)) {
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
            known = llama_opt_grammar_next_bytes(*after, second, ends_after);
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

bool llama_opt_grammar::allows(llama_token token) {
    check_timer timer{ check_ns_ };
    return !allowed(&token, 1).empty();
}

void llama_opt_grammar::accept(llama_token token) {
    llama_grammar_accept_impl(*grammar_, token);
    budget_.spend_token();
}

bool llama_opt_grammar::accept_text(llama_token token, const std::string & text) {
    try {
        llama_grammar_accept_token(*grammar_, token, text);
    } catch (const std::runtime_error &) {  // (no stack left: the grammar is at a dead end)
        return false;
    }
    return true;
}

void llama_opt_grammar::set_budget(size_t tokens) {
    budget_.set(tokens);
}
