// Session (llama_opt_session).

#include "bindings.h"

#include "llama-opt-session.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

void register_session(py::module_ & m) {
    py::class_<llama_opt_session, std::shared_ptr<llama_opt_session>>(m, "Session", "One sequence of a context (see pyllamaopt.Session).")
        .def("append", &llama_opt_session::append, py::arg("tokens"), py::call_guard<py::gil_scoped_release>())
        .def("sync", &llama_opt_session::sync, py::arg("tokens"), py::call_guard<py::gil_scoped_release>())
        .def("fork", &llama_opt_session::fork, py::call_guard<py::gil_scoped_release>())
        .def("save", &llama_opt_session::save, py::call_guard<py::gil_scoped_release>())
        .def("set_grammar", &llama_opt_session::set_grammar, py::arg("gbnf"))
        .def("set_sampling", [](llama_opt_session & self, float temperature, int32_t top_k, float top_p, float min_p, uint32_t seed) {
                 self.set_sampling({ temperature, top_k, top_p, min_p, seed });
             }, py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("min_p"), py::arg("seed"))
        .def("next_token", &llama_opt_session::next_token, py::call_guard<py::gil_scoped_release>())
        .def("end_turn", &llama_opt_session::end_turn)
        .def("close", &llama_opt_session::close)
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
        .def_property_readonly("seq", &llama_opt_session::seq);
}
