// Model (llama_opt_model).

#include "bindings.h"

#include "engine/model.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>

void register_model(py::module_ & m) {
    py::class_<llama_opt_model, std::shared_ptr<llama_opt_model>>(m, "Model", "A loaded GGUF model (see pyllamaopt.Model).")
        .def(py::init([](const std::string & path, bool use_mmap, py::object on_progress) {
                 llama_opt_model_params params;
                 params.use_mmap = use_mmap;
                 if (!on_progress.is_none()) {
                     params.on_progress = [on_progress](float p) {
                         py::gil_scoped_acquire gil;
                         return on_progress(p).cast<bool>();
                     };
                 }
                 py::gil_scoped_release nogil;
                 return std::make_shared<llama_opt_model>(path, params);
             }), py::arg("path"), py::arg("use_mmap") = true, py::arg("on_progress") = py::none())
        .def("tokenize", &llama_opt_model::tokenize, py::arg("text"), py::arg("add_special"), py::arg("parse_special"),
             py::call_guard<py::gil_scoped_release>())  // (the vocabulary is read-only: the server tokenizes in a thread)
        .def("token_piece", [](const llama_opt_model & self, llama_token t, bool special) {
                 return py::bytes(self.token_piece(t, special));
             }, py::arg("token"), py::arg("special") = true, "The token's bytes (may be part of a UTF-8 character).")
        .def("detokenize", [](const llama_opt_model & self, const std::vector<llama_token> & t, bool remove_special, bool unparse_special) {
                 return decode_utf8(self.detokenize(t, remove_special, unparse_special));
             }, py::arg("tokens"), py::arg("remove_special") = false, py::arg("unparse_special") = true)
        .def("is_eog", &llama_opt_model::is_eog, py::arg("token"))
        .def("meta", [](const llama_opt_model & self, const std::string & key) { return decode_utf8(self.meta(key)); }, py::arg("key"))
        .def("metadata", [](const llama_opt_model & self) {
                 py::dict out;
                 for (const auto & kv : self.metadata()) {
                     out[decode_utf8(kv.first)] = decode_utf8(kv.second);
                 }
                 return out;
             })
        .def_property_readonly("path", &llama_opt_model::path)
        .def_property_readonly("chat_template", [](const llama_opt_model & self) { return decode_utf8(self.chat_template()); })
        .def_property_readonly("description", &llama_opt_model::description)
        .def_property_readonly("n_vocab", &llama_opt_model::n_vocab)
        .def_property_readonly("n_ctx_train", &llama_opt_model::n_ctx_train)
        .def_property_readonly("n_layer", &llama_opt_model::n_layer)
        .def_property_readonly("n_embd", &llama_opt_model::n_embd)
        .def_property_readonly("n_head", &llama_opt_model::n_head)
        .def_property_readonly("n_head_kv", &llama_opt_model::n_head_kv)
        .def_property_readonly("n_swa", &llama_opt_model::n_swa)
        .def_property_readonly("n_params", &llama_opt_model::n_params)
        .def_property_readonly("kv_bytes_per_token", &llama_opt_model::kv_bytes_per_token)
        .def_property_readonly("size_bytes", &llama_opt_model::size_bytes)
        .def_property_readonly("bos", &llama_opt_model::bos)
        .def_property_readonly("eos", &llama_opt_model::eos)
        .def_property_readonly("add_bos", &llama_opt_model::add_bos);
}
