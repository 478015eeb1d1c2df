#pragma once

// One register_<thing> per bound class; module.cpp calls them in order.

#include <pybind11/pybind11.h>

#include <string>

namespace py = pybind11;

void register_errors(py::module_ & m);
void register_config(py::module_ & m);
void register_stats(py::module_ & m);
void register_hash(py::module_ & m);
void register_diff(py::module_ & m);
void register_model(py::module_ & m);
void register_context(py::module_ & m);
void register_session(py::module_ & m);
void register_persist(py::module_ & m);
void register_spec_prefill(py::module_ & m);
void register_memo(py::module_ & m);
void register_chat_templates(py::module_ & m);

// A disk tier entry's layout (the model, build and KV shape it is for) as a dict: an entry is
// usable by a context whose Context.persist_layout equals it (kv/disk-entry.h).
struct llama_opt_persist_layout;
py::dict persist_layout_dict(const llama_opt_persist_layout & layout);

// Text from llama.cpp may end inside a UTF-8 sequence; never fail on it.
inline py::str decode_utf8(const std::string & s) {
    return py::reinterpret_steal<py::str>(PyUnicode_DecodeUTF8(s.data(), (Py_ssize_t) s.size(), "replace"));
}
