#include "base/stats.h"

#include <cstdio>
#include <sstream>

const std::vector<llama_opt_stats_field> & llama_opt_stats_fields() {
    static const std::vector<llama_opt_stats_field> fields = {
#define LLAMA_OPT_COUNTER(name) { #name, &llama_opt_stats::name },
#include "base/counters.def"
#undef LLAMA_OPT_COUNTER
    };
    return fields;
}

llama_opt_stats & llama_opt_stats::operator+=(const llama_opt_stats & other) {
    for (const auto & f : llama_opt_stats_fields()) {
        this->*(f.member) += other.*(f.member);
    }
    return *this;
}

llama_opt_stats llama_opt_stats::operator-(const llama_opt_stats & other) const {
    llama_opt_stats d = *this;
    for (const auto & f : llama_opt_stats_fields()) {
        d.*(f.member) -= other.*(f.member);
    }
    return d;
}

std::string llama_opt_stats::to_string() const {
    // Fields are grouped by their prefix ("dedup", "diff", ...), one line per group.
    std::ostringstream out;
    std::string group;
    for (const auto & f : llama_opt_stats_fields()) {
        const std::string name = f.name;
        const std::string g    = name.substr(0, name.find('_'));
        if (g != group) {
            out << (group.empty() ? "" : "\n") << g << ":";
            group = g;
        }
        out << " " << name.substr(g.size() + 1) << "=" << this->*(f.member);
    }
    return out.str();
}

void llama_opt_stats::print() const {
    fprintf(stderr, "[llama-opt stats]\n%s\n", to_string().c_str());
}
