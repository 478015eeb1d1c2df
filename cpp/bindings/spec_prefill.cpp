// Speculative prefill's host-side scoring (methods/attn-score, specification 001) as functions, so
// that tests can hold it against a NumPy reference on any input.

#include "bindings.h"

#include "methods/attn-score.h"

#include <pybind11/stl.h>

void register_spec_prefill(py::module_ & m) {
    m.def("spec_prefill_importance",
        [](const std::vector<std::vector<float>> & q, const std::vector<std::vector<float>> & k, uint32_t n_head,
           uint32_t n_head_kv, uint32_t head_dim, float scale, uint32_t last_layers, uint32_t pool, uint32_t window) {
            if (q.size() != k.size() || n_head == 0 || n_head_kv == 0 || head_dim == 0 || n_head % n_head_kv != 0) {
                throw llama_opt_error(llama_opt_errc::invalid_argument,
                    "spec_prefill_importance needs one query and one key list per layer, and n_head a multiple of n_head_kv");
            }
            const size_t key_row = (size_t) n_head_kv * head_dim;
            const size_t n_keys  = k.empty() ? 0 : k[0].size() / key_row;
            const size_t n_query = std::min<size_t>(std::max<uint32_t>(window, 1), n_keys);
            llama_opt_attn_shape shape;
            shape.n_head = n_head, shape.n_head_kv = n_head_kv, shape.head_dim = head_dim, shape.scale = scale;
            std::vector<llama_opt_spec_layer> layers;
            for (size_t i = 0; i < q.size(); ++i) {
                if (q[i].size() != n_query * n_head * head_dim || k[i].size() != n_keys * key_row) {
                    throw llama_opt_error(llama_opt_errc::invalid_argument,
                        "spec_prefill_importance: layer " + std::to_string(i) + " has " + std::to_string(q[i].size()) +
                        " query values and " + std::to_string(k[i].size()) + " key values; expected "
                        "min(window, n_keys)·n_head·head_dim and n_keys·n_head_kv·head_dim");
                }
                layers.push_back({ q[i].data(), k[i].data() });
            }
            return llama_opt_spec_importance(shape, layers, n_keys, window, last_layers, pool);
        },
        py::arg("q"), py::arg("k"), py::arg("n_head"), py::arg("n_head_kv"), py::arg("head_dim"), py::arg("scale"),
        py::arg("last_layers") = 0, py::arg("pool") = 1, py::arg("window") = 1,
        "001's importance of each prompt token: per layer (q: the last min(window, n_keys) tokens' window × n_head × "
        "head_dim queries, k: the prompt's n_keys × n_head_kv × head_dim keys, flattened), per query a causal softmax "
        "per head, max over heads, mean over the queries; mean over the last `last_layers` layers (0: all); average "
        "pooling over `pool` neighbours.");
    m.def("spec_prefill_keep", &llama_opt_spec_keep, py::arg("importance"), py::arg("keep"), py::arg("window") = 1,
          "001's top-k: the indices of the ceil(keep · n) most important tokens, the last min(window, k) always among "
          "them, increasing.");
}
