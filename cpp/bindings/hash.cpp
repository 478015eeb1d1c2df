// context-hash functions, for tests and for tools that name blocks the way the engine does.

#include "bindings.h"

#include "kv/block-hash.h"

#include <pybind11/stl.h>

void register_hash(py::module_ & m) {
    m.def("hash_block", [](const std::vector<llama_token> & t) { return llama_opt_hash_block(t.data(), (uint32_t) t.size()); },
          py::arg("tokens"), "FNV-1a 64-bit over the tokens as 32-bit little-endian values.");
    m.def("hash_block_pos", [](const std::vector<llama_token> & t, llama_pos pos) {
              return llama_opt_hash_block_pos(t.data(), (uint32_t) t.size(), pos);
          }, py::arg("tokens"), py::arg("pos_start"), "Position-dependent block hash.");
    m.def("hash_chain", [](uint64_t parent, const std::vector<llama_token> & t) {
              return llama_opt_hash_chain(parent, t.data(), (uint32_t) t.size());
          }, py::arg("parent"), py::arg("tokens"), "Chained hash: parent's chained hash, then the tokens.");
    m.def("segment", [](const std::vector<llama_token> & t, uint32_t block_size) {
              py::list out;
              for (const auto & b : llama_opt_segment(t.data(), (uint32_t) t.size(), block_size)) {
                  out.append(py::make_tuple(b.start, b.n_tokens, b.hash, b.chain));
              }
              return out;
          }, py::arg("tokens"), py::arg("block_size"), "Blocks as (start, n_tokens, hash, chain_hash).");

    py::class_<llama_opt_hasher>(m, "Hasher", "Incremental FNV-1a: feed tokens, finalize.")
        .def(py::init<>())
        .def("feed", [](llama_opt_hasher & h, const std::vector<llama_token> & t) { h.feed(t.data(), (uint32_t) t.size()); },
             py::arg("tokens"))
        .def("finalize", &llama_opt_hasher::finalize)
        .def("reset", &llama_opt_hasher::reset);
}
