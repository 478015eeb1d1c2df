#pragma once

// session/approx-settings: the settings of a session's approximate (Tier 2) methods
// (attn_prune_*, sparse_*, spec_prefill_*): its own (set_tier2), else its context's.

#include "engine/context.h"
#include "base/config.h"
#include "base/types.h"

#include <memory>

class llama_opt_approx_settings {
public:
    explicit llama_opt_approx_settings(const llama_opt_context & ctx) : ctx_(ctx) {}

    const llama_opt_config & get() const { return own_ ? *own_ : ctx_.settings().config; }

    // The session's own; invalid_argument if a method needs what the context was not made with.
    void set(const llama_opt_config & config) {
        if (config.attn_prune_enabled && !ctx_.attn_capture()) {
            throw llama_opt_error(llama_opt_errc::invalid_argument,
                "attention-sink pruning needs a context made with attn_prune_enabled (the model's queries are "
                "observed through the eval callback, which is set when the context is made)", "attn_prune_enabled");
        }
        if (config.spec_prefill_enabled && !ctx_.attn_capture() && !ctx_.spec_draft()) {
            throw llama_opt_error(llama_opt_errc::invalid_argument,
                "speculative prefill needs a context made with spec_prefill_enabled (its scorer observes the model's "
                "queries and keys through the eval callback, set when the context is made, or loads the draft model)",
                "spec_prefill_enabled");
        }
        own_ = std::make_unique<llama_opt_config>(config);
    }

    void copy_to(llama_opt_approx_settings & fork) const {
        if (own_) {
            fork.own_ = std::make_unique<llama_opt_config>(*own_);
        }
    }

private:
    const llama_opt_context &         ctx_;
    std::unique_ptr<llama_opt_config> own_;  // null: the context's
};
