// Session (llama_opt_session).

#include "bindings.h"

#include "session/session.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <optional>

void register_session(py::module_ & m) {
    py::class_<llama_opt_sampling>(m, "Sampling", "How a generation picks tokens (greedy when temperature <= 0).")
        .def(py::init<>())
        .def_readwrite("temperature", &llama_opt_sampling::temperature)
        .def_readwrite("top_k", &llama_opt_sampling::top_k)
        .def_readwrite("top_p", &llama_opt_sampling::top_p)
        .def_readwrite("min_p", &llama_opt_sampling::min_p)
        .def_property("seed",  // None: a random seed
            [](const llama_opt_sampling & s) { return s.seed == LLAMA_DEFAULT_SEED ? std::optional<uint32_t>() : s.seed; },
            [](llama_opt_sampling & s, std::optional<uint32_t> seed) { s.seed = seed.value_or(LLAMA_DEFAULT_SEED); })
        .def_property("logit_bias",  // (token, bias) pairs
            [](const llama_opt_sampling & s) {
                std::vector<std::pair<llama_token, float>> pairs;
                for (const llama_logit_bias & b : s.logit_bias) {
                    pairs.emplace_back(b.token, b.bias);
                }
                return pairs;
            },
            [](llama_opt_sampling & s, const std::vector<std::pair<llama_token, float>> & pairs) {
                s.logit_bias.clear();
                for (const auto & [token, bias] : pairs) {
                    s.logit_bias.push_back({ token, bias });
                }
            })
        .def_property("repeat_penalty", [](const llama_opt_sampling & s) { return s.penalties.repeat; },
                      [](llama_opt_sampling & s, float v) { s.penalties.repeat = v; })
        .def_property("frequency_penalty", [](const llama_opt_sampling & s) { return s.penalties.frequency; },
                      [](llama_opt_sampling & s, float v) { s.penalties.frequency = v; })
        .def_property("presence_penalty", [](const llama_opt_sampling & s) { return s.penalties.presence; },
                      [](llama_opt_sampling & s, float v) { s.penalties.presence = v; })
        .def_property("repeat_last_n", [](const llama_opt_sampling & s) { return s.penalties.last_n; },
                      [](llama_opt_sampling & s, int32_t v) { s.penalties.last_n = v; })
        .def_readwrite("logprobs", &llama_opt_sampling::logprobs);

    py::class_<llama_opt_grammar_trigger>(m, "GrammarTrigger", R"doc(
When a lazy grammar starts (Session.set_grammar's triggers), as llama.cpp's chat layer gives them:
kind 'word' or 'pattern' (found anywhere in the output), 'pattern_full' (the whole output matches)
or 'token' (that token id generated).

    GrammarTrigger("word", "<tool_call>")
)doc")
        .def(py::init([](const std::string & kind, const std::string & value, llama_token token) {
                 return llama_opt_grammar_trigger{ llama_opt_trigger_kind_from_name(kind), value, token };
             }), py::arg("kind"), py::arg("value") = "", py::arg("token") = -1)
        .def_property_readonly("kind", [](const llama_opt_grammar_trigger & t) {
            static const char * names[] = { "token", "word", "pattern", "pattern_full" };
            return names[(int) t.kind];
        })
        .def_readonly("value", &llama_opt_grammar_trigger::value)
        .def_readonly("token", &llama_opt_grammar_trigger::token);

    py::class_<llama_opt_token_logprob>(m, "TokenLogprob",
                                        "A token's log-probability under the model's raw logits, and the most likely tokens there.")
        .def_readonly("token", &llama_opt_token_logprob::token)
        .def_readonly("logprob", &llama_opt_token_logprob::logprob)
        .def_readonly("top", &llama_opt_token_logprob::top);

    py::class_<llama_opt_step>(m, "Step", "One generated token (token -1: the grammar allows none).")
        .def_readonly("token", &llama_opt_step::token)
        .def_readonly("eog", &llama_opt_step::eog)
        .def_property_readonly("piece", [](const llama_opt_step & s) { return py::bytes(s.piece); })
        .def_readonly("room", &llama_opt_step::room)
        .def_property_readonly("logprob", [](const llama_opt_step & s) { return s.logprob; });  // None: not asked

    py::enum_<llama_opt_span_kind>(m, "SpanKind", "What appended tokens are, for the Tier-2 methods.")
        .value("text", llama_opt_span_kind::text)
        .value("system", llama_opt_span_kind::system)
        .value("tool", llama_opt_span_kind::tool);

    py::class_<llama_opt_session, std::shared_ptr<llama_opt_session>>(m, "Session", "One sequence of a context (see pyllamaopt.Session).")
        .def("append", py::overload_cast<const std::vector<llama_token> &, llama_opt_span_kind>(&llama_opt_session::append),
             py::arg("tokens"), py::arg("kind") = llama_opt_span_kind::text, py::call_guard<py::gil_scoped_release>())
        .def("set_tier2", [](llama_opt_session & self, const llama_opt_settings & settings) { self.set_tier2(settings.config); },
             py::arg("settings"))
        .def("drop_span", &llama_opt_session::drop_span, py::arg("start"), py::arg("end"))
        .def_property_readonly("holes", &llama_opt_session::holes)
        .def_property_readonly("n_cold", &llama_opt_session::n_cold)
        .def("attention_probe", [](llama_opt_session & self) {
                 llama_opt_attn_probe p;
                 {
                     py::gil_scoped_release nogil;
                     p = self.attention_probe();
                 }
                 const py::ssize_t L = (py::ssize_t) p.layers.size(), Q = (py::ssize_t) p.q_pos.size(),
                                   K = (py::ssize_t) p.k_pos.size(), H = p.shape.n_head, G = p.shape.n_head_kv,
                                   D = p.shape.head_dim;
                 py::dict d;
                 d["layers"] = p.layers;
                 d["n_head"] = p.shape.n_head;
                 d["n_head_kv"] = p.shape.n_head_kv;
                 d["head_dim"] = p.shape.head_dim;
                 d["scale"] = p.shape.scale;
                 d["q_pos"] = py::array_t<llama_pos>(Q, p.q_pos.data());
                 d["k_pos"] = py::array_t<llama_pos>(K, p.k_pos.data());
                 d["q"] = py::array_t<float>({ L, Q, H, D }, p.q.data());
                 d["k"] = py::array_t<float>({ L, K, G, D }, p.k.data());
                 d["scores"] = py::array_t<float>(K, p.scores.data());
                 return d;
             },
             "The last append's queries, the keys and their attention scores (needs attn_prune_enabled).")
        .def("sync", py::overload_cast<const std::vector<llama_token> &, const std::vector<std::pair<size_t, size_t>> &>(
                 &llama_opt_session::sync),
             py::arg("tokens"), py::arg("tool_spans") = std::vector<std::pair<size_t, size_t>>(),
             py::call_guard<py::gil_scoped_release>())
        .def("score", &llama_opt_session::score, py::arg("tokens"), py::arg("top_n") = 0,
             py::call_guard<py::gil_scoped_release>())
        .def("fork", &llama_opt_session::fork, py::call_guard<py::gil_scoped_release>())
        .def("save", &llama_opt_session::save, py::call_guard<py::gil_scoped_release>())
        .def("set_grammar", &llama_opt_session::set_grammar, py::arg("gbnf"), py::arg("max_tokens") = 0,
             py::arg("triggers") = std::vector<llama_opt_grammar_trigger>(), py::arg("prefill") = "")
        .def("set_sampling", &llama_opt_session::set_sampling, py::arg("sampling"))
        .def("next_token", &llama_opt_session::next_token, py::call_guard<py::gil_scoped_release>())
        .def("step", &llama_opt_session::step, py::call_guard<py::gil_scoped_release>())
        .def("end_turn", &llama_opt_session::end_turn)
        .def("close", &llama_opt_session::close)
        .def("discard", &llama_opt_session::discard)
        .def("stats", &llama_opt_session::stats)
        .def("logits", [](llama_opt_session & self) {
                 std::vector<float> l;
                 {
                     py::gil_scoped_release nogil;
                     l = self.logits();
                 }
                 return py::array_t<float>((py::ssize_t) l.size(), l.data());
             })
        .def_property_readonly("closed", &llama_opt_session::closed)
        .def_property("pinned", &llama_opt_session::pinned, &llama_opt_session::set_pinned)
        .def_property_readonly("tokens", &llama_opt_session::tokens)
        .def_property_readonly("n_evaluated", &llama_opt_session::n_evaluated)
        .def_property_readonly("n_canonical", &llama_opt_session::n_canonical)
        .def_property_readonly("approx_from", [](const llama_opt_session & self) -> py::object {
            if (self.approx_from() == llama_opt_session::npos) {
                return py::none();
            }
            return py::int_(self.approx_from());
        })
        .def_property_readonly("evicted", &llama_opt_session::evicted)
        .def_property_readonly("room", &llama_opt_session::room)
        .def_property_readonly("seq", &llama_opt_session::seq)
        .def_property_readonly("invariant_violation", [](const llama_opt_session & self) -> std::optional<std::string> {
            std::string what = self.invariant_violation();
            return what.empty() ? std::nullopt : std::optional<std::string>(what);
        });

    m.def("prefetch_steps", &llama_opt_session::prefetch_steps, py::arg("sessions"),
          py::call_guard<py::gil_scoped_release>(),
          "Computes the pending decode step of several generating sessions in shared batches "
          "(bitwise as each alone); their next step() then only samples.");
}
