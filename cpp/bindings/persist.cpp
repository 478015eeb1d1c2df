// PersistStore (llama_opt_persist_store): the disk tier's directory, to inspect and clean.

#include "bindings.h"

#include "kv/disk-dir.h"
#include "kv/disk-store.h"
#include "kv/kv-codec.h"

#include <pybind11/stl.h>

py::dict persist_layout_dict(const llama_opt_persist_layout & l) {
    using namespace pybind11::literals;
    return py::dict("model_hash"_a = l.model_hash, "compat_hash"_a = l.compat_hash, "block_size"_a = l.block_size,
                    "n_layers"_a = l.n_layers, "n_kv_heads"_a = l.n_kv_heads, "k_dim"_a = l.k_dim, "v_dim"_a = l.v_dim,
                    "k_type"_a = l.k_type, "v_type"_a = l.v_type,
                    "kv_type"_a = llama_opt_kv_types_name(l.k_type, l.v_type), "bytes_per_token"_a = l.bytes_per_token);
}

static py::dict entry_dict(const llama_opt_persist_entry & e) {
    py::dict d;
    d["path"]         = e.path;
    d["n_tokens"]     = e.n_tokens;
    d["base_tokens"]  = e.base_blocks * e.layout.block_size;
    d["size"]         = e.file_size;
    d["mtime"]        = e.mtime;
    d["context_hash"] = e.context_hash;
    d["model_hash"]   = e.layout.model_hash;
    d["compat_hash"]  = e.layout.compat_hash;
    d["layout"]       = persist_layout_dict(e.layout);
    d["chain"]        = e.chain;  // every block's chained hash (an extension's parents' blocks too)
    d["problem"]      = e.problem;
    return d;
}

void register_persist(py::module_ & m) {
    py::class_<llama_opt_persist_store>(m, "PersistStore")
        .def(py::init<std::string>(), py::arg("dir"))
        .def_property_readonly("dir", &llama_opt_persist_store::dir)
        .def("list", [](const llama_opt_persist_store & s) {
                 std::vector<llama_opt_persist_entry> entries;
                 {
                     py::gil_scoped_release nogil;
                     entries = s.list();
                 }
                 py::list out;
                 for (const auto & e : entries) {
                     out.append(entry_dict(e));
                 }
                 return out;
             })
        .def("verify", &llama_opt_persist_store::verify, py::arg("path"), py::call_guard<py::gil_scoped_release>())
        .def("cleanup", [](const llama_opt_persist_store & s, int64_t max_age_s, uint64_t max_bytes) {
                 return s.cleanup(max_age_s, max_bytes);
             }, py::arg("max_age_s"), py::arg("max_bytes"), py::call_guard<py::gil_scoped_release>())
        .def("remove", &llama_opt_persist_store::remove, py::arg("path"))
        .def("check_dir", [](const llama_opt_persist_store & s) {
                 std::string why;
                 return llama_opt_persist_check_dir(s.dir(), why) ? std::string() : why;
             }, "Why a context with persistence would refuse the directory ('' if it would use it); "
                "tightens a 0755 one of ours to 0700, as such a context does.")
        .def("_fail_after_bytes", &llama_opt_persist_store::fail_after_bytes, py::arg("n"));
    m.def("default_persist_dir", &llama_opt_persist_default_dir);
}
