// Context (llama_opt_context).

#include "bindings.h"

#include "engine/context.h"
#include "ggml.h"
#include "session/session.h"

#include <pybind11/stl.h>

// A read of the context's KV memory, under the context's lock.
template <typename R> static auto memory_read(R (llama_opt_kv_memory::*read)() const) {
    return [read](const llama_opt_context & self) {
        std::lock_guard<std::recursive_mutex> lock(self.mutex());
        return (self.memory().*read)();
    };
}

void register_context(py::module_ & m) {
    py::class_<llama_opt_context, std::shared_ptr<llama_opt_context>>(m, "Context", "A llama context with sessions (see pyllamaopt.Context).")
        .def(py::init([](std::shared_ptr<llama_opt_model> model, const llama_opt_settings & settings, uint32_t n_ctx,
                         uint32_t n_batch, uint32_t n_seq_max, int32_t n_threads, int32_t n_threads_batch, bool flash_attn,
                         bool swa_full, bool canonical, const std::string & profile) {
                 llama_opt_context_params p;
                 p.n_ctx = n_ctx;
                 p.n_batch = n_batch;
                 p.n_seq_max = n_seq_max;
                 p.n_threads = n_threads;
                 p.n_threads_batch = n_threads_batch;
                 p.flash_attn = flash_attn;
                 p.swa_full = swa_full;
                 p.canonical = canonical;
                 if (profile == "time") {
                     p.profile = llama_opt_profile_mode::time;
                 } else if (profile == "facts") {
                     p.profile = llama_opt_profile_mode::facts;
                 } else if (profile != "none") {
                     throw llama_opt_error(llama_opt_errc::invalid_argument,
                                           "profile must be 'none', 'time' or 'facts', got '" + profile + "'", "profile");
                 }
                 py::gil_scoped_release nogil;
                 return std::make_shared<llama_opt_context>(std::move(model), p, settings);
             }), py::arg("model"), py::arg("settings"), py::arg("n_ctx"), py::arg("n_batch"), py::arg("n_seq_max"),
             py::arg("n_threads"), py::arg("n_threads_batch"), py::arg("flash_attn"), py::arg("swa_full"), py::arg("canonical"),
             py::arg("profile") = "none")
        .def("open_session", [](std::shared_ptr<llama_opt_context> self) { return llama_opt_session::open(std::move(self)); })
        .def("close", &llama_opt_context::close, py::call_guard<py::gil_scoped_release>())
        .def("stats", &llama_opt_context::stats)
        .def("reset_stats", &llama_opt_context::reset_stats)
        .def("flush_persist", [](llama_opt_context & self, double timeout) {
                 llama_opt_persist_write_behind * writer = self.memory().write_behind();  // (lives as long as self)
                 return writer == nullptr || writer->flush(timeout);
             }, py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
             "Waits up to `timeout` seconds until the KV queued for the disk tier's background writer is "
             "written; False if some is still queued. True at once without write-behind.")
        .def("_set_test_hash_mask", [](llama_opt_context & self, uint64_t mask) { self.memory().set_test_hash_mask(mask); },
             py::arg("mask"),
             "Test hook: keep only these bits of block hashes, forcing collisions.")
        .def("_hold_persist_writer", [](llama_opt_context & self, bool held) {
                 if (llama_opt_persist_write_behind * writer = self.memory().write_behind()) {
                     writer->hold(held);
                 }
             }, py::arg("held"),
             "Test hook: while held, the disk tier's background writer takes no job (they queue up).")
        .def("_set_swa_view", [](llama_opt_context & self, bool on) { self.memory().set_swa_view(on); }, py::arg("on"),
             "Test hook: sliding-window layers attend over the window's cells (True, the default of a canonical "
             "context) or over the whole cache (False, llama.cpp's way); the results are the same bits.")
        .def("_test_kv_remove", [](llama_opt_context & self, int32_t seq, llama_pos p0, llama_pos p1) {
                 std::lock_guard<std::recursive_mutex> lock(self.mutex());
                 self.memory().remove(seq, p0, p1);
             }, py::arg("seq"), py::arg("p0"), py::arg("p1"),
             "Test hook: remove a sequence's KV behind its session's back (an invariant violation).")
        .def("_test_kv_cell", [](llama_opt_context & self, int32_t seq, size_t pos) {
                 std::lock_guard<std::recursive_mutex> lock(self.mutex());
                 return self.memory().cell(seq, pos);
             }, py::arg("seq"), py::arg("pos"), "Test hook: the KV cell holding a position of a sequence, -1 if none.")
        .def("op_profile", [](const llama_opt_context & self) {
                 py::list out;
                 if (const llama_opt_op_profile * profile = self.op_profile()) {
                     std::lock_guard<std::recursive_mutex> lock(self.mutex());
                     for (const auto & [key, s] : profile->stats()) {
                         py::dict d;
                         d["op"] = s.op;
                         d["name"] = s.name;
                         d["weight"] = s.weight;
                         d["calls"] = s.calls;
                         d["elements"] = s.elements;
                         d["ns"] = s.ns;
                         d["cpu_ns"] = s.cpu_ns;
                         d["rows"] = s.rows;
                         d["rows_dup"] = s.rows_dup;
                         d["rows_seen"] = s.rows_seen;
                         d["rows_zero"] = s.rows_zero;
                         d["outputs_zero"] = s.outputs_zero;
                         d["identity_calls"] = s.identity_calls;
                         d["onehot_rows"] = s.onehot_rows;
                         out.append(d);
                     }
                 }
                 return out;
             }, "The operation profile (profile='time' or 'facts'): one dict per group of graph nodes.")
        .def("row_kernels", [](const llama_opt_context & self) {
                 py::list out;
                 for (const auto & c : self.row_kernels().report()) {
                     py::dict d;
                     d["type"] = ggml_type_name((ggml_type) c.type);
                     d["rows"] = c.rows;
                     d["multi"] = c.multi;
                     d["multi_ns_per_element"] = c.multi_arm.ns_per_work;
                     d["multi_samples"] = c.multi_arm.samples;
                     d["one_ns_per_element"] = c.one_arm.ns_per_work;
                     d["one_samples"] = c.one_arm.samples;
                     out.append(d);
                 }
                 return out;
             }, "What row_kernels=2 measured: per (weight type, rows) cell, the arm it takes next (multi-row "
                "kernels or row by row) and each arm's time per weight element and samples.")
        .def("reset_op_profile", [](llama_opt_context & self) {
                 std::lock_guard<std::recursive_mutex> lock(self.mutex());
                 if (llama_opt_op_profile * profile = self.op_profile()) {
                     profile->reset();
                 }
             })
        .def_property_readonly("pool_blocks", [](llama_opt_context & self) {
                 std::lock_guard<std::recursive_mutex> lock(self.mutex());
                 return self.memory().pool() ? self.memory().pool()->size() : 0u;
             }, "Blocks in the dedup pool (0 without dedup).")
        .def_property_readonly("pool_chains", [](llama_opt_context & self) {
                 std::lock_guard<std::recursive_mutex> lock(self.mutex());
                 return self.memory().pool() ? self.memory().pool()->hashes() : std::vector<uint64_t>();
             }, "The chained hash of every block in the dedup pool (the prefixes whose KV this context holds; "
                "empty without dedup).")
        .def_property_readonly("closed", &llama_opt_context::closed)
        .def_property_readonly("n_ctx", &llama_opt_context::n_ctx)
        .def_property_readonly("n_sessions", memory_read(&llama_opt_kv_memory::n_sessions))
        .def_property_readonly("n_cached", memory_read(&llama_opt_kv_memory::n_cached))
        .def_property_readonly("kv_cells_used", memory_read(&llama_opt_kv_memory::cells_used))
        .def_property_readonly("block_size", &llama_opt_context::block_size)
        .def_property_readonly("kv_type", [](const llama_opt_context & self) { return self.kv_codec().name(); },
                               "How the cache stores K and V: \"q8_0\" when they share a type, \"q8_0/q4_0\" (K/V) when not.")
        .def_property_readonly("kv_type_k", [](const llama_opt_context & self) { return self.kv_codec().k.name; })
        .def_property_readonly("kv_type_v", [](const llama_opt_context & self) { return self.kv_codec().v.name; })
        .def_property_readonly("kv_bytes_per_token", &llama_opt_context::kv_bytes_per_token,
                               "KV cache bytes of one token in this context's kv_type (K and V, all layers, each in its type).")
        .def_property_readonly("min_chunk", &llama_opt_context::min_chunk)
        .def_property_readonly("canonical", &llama_opt_context::canonical)
        .def_property_readonly("settings", &llama_opt_context::settings)
        .def_property_readonly("persist", [](const llama_opt_context & self) { return self.memory().persist(); },
                               py::return_value_policy::reference_internal)
        .def_property_readonly("persist_layout", [](const llama_opt_context & self) -> py::object {
                                   if (self.memory().persist() == nullptr) {
                                       return py::none();
                                   }
                                   return persist_layout_dict(self.memory().persist_layout());
                               }, "The layout of the disk tier entries this context writes and restores (None "
                                  "without persistence): an entry whose layout differs is for another model or build.");
}
