// memo's draft search, for tools: what drafting costs over the steps of a generation.

#include "bindings.h"

#include "methods/memo.h"

#include <chrono>
#include <pybind11/stl.h>

void register_memo(py::module_ & m) {
    m.def("memo_draft_cost", [](const std::vector<llama_token> & history, size_t start, uint32_t max_tokens) {
              // the search a session runs before each step, at every history length from start on
              size_t drafts = 0;
              const auto t0 = std::chrono::steady_clock::now();
              for (size_t n = start; n <= history.size(); ++n) {
                  drafts += !llama_opt_memo_find(history.data(), n, max_tokens).tokens.empty();
              }
              const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0);
              return py::make_tuple(drafts, (uint64_t) ns.count());
          }, py::arg("history"), py::arg("start"), py::arg("max_tokens") = LLAMA_OPT_MEMO_MATCH_MAX,
          "Runs memo's draft search (llama_opt_memo_find) on history[:n] for every n from start to the end: "
          "(drafts found, nanoseconds), without any conversion in the timing.");
}
