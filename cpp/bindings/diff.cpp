// DiffEngine (llama_opt_diff_engine), for tests and tools.

#include "bindings.h"

#include "kv/history-diff.h"

#include <pybind11/stl.h>

void register_diff(py::module_ & m) {
    py::class_<llama_opt_diff_engine>(m, "DiffEngine", R"doc(
The structural diff of two token histories.

    spans = DiffEngine(block_size=64).compute(prev, curr)
    # [("keep", prev_start, prev_length, curr_start, curr_length), ("insert", ...), ...]
)doc")
        .def(py::init<uint32_t, uint32_t>(), py::arg("block_size") = 64, py::arg("min_unchanged") = 1)
        .def("compute", [](const llama_opt_diff_engine & e, const std::vector<llama_token> & prev, const std::vector<llama_token> & curr) {
                 static const char * names[] = { "keep", "insert", "delete", "replace" };
                 py::list out;
                 for (const auto & s : e.compute(prev.data(), (uint32_t) prev.size(), curr.data(), (uint32_t) curr.size())) {
                     out.append(py::make_tuple(names[s.op], s.prev_start, s.prev_length, s.curr_start, s.curr_length));
                 }
                 return out;
             }, py::arg("prev"), py::arg("curr"))
        .def_property_readonly("last_work", &llama_opt_diff_engine::last_work,
                               "Tokens compared or hashed by the last compute().");
}
