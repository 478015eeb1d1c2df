// pyllamaopt._core: the C++ engine, bound thinly. The Pythonic API lives in pyllamaopt/.

#include "bindings.h"

#include "engine/log.h"
#include "engine/model.h"
#include "llama.h"

#ifndef PYLLAMAOPT_VERSION
#define PYLLAMAOPT_VERSION "0+unknown"
#endif

PYBIND11_MODULE(_core, m) {
    m.doc() = "pyllamaopt engine (C++). Use the classes of the pyllamaopt package instead.";

    register_errors(m);
    register_config(m);
    register_stats(m);
    register_hash(m);
    register_diff(m);
    register_memo(m);
    register_model(m);
    register_chat_templates(m);
    register_persist(m);  // before the context and the session: their signatures name these classes
    register_session(m);
    register_context(m);
    register_spec_prefill(m);

    m.def("set_verbose", &llama_opt_log_set_verbose, py::arg("verbose"),
          "Print llama.cpp's log to stderr (default: silent; warnings are kept for error messages).");
    m.def("_set_q5_0_widened", &llama_opt_set_q5_0_widened, py::arg("on"),
          "Q5_0 weights held as Q8_0 (patches/0016, the default) in models loaded after this call; off "
          "only for side-by-side measurement.");
    m.def("build_info", [] {
        py::dict info;
        info["version"]            = PYLLAMAOPT_VERSION;
        info["llama_cpp_commit"]   = LLAMA_OPT_LLAMA_COMMIT;
        info["llama_cpp_build"]    = LLAMA_OPT_LLAMA_BUILD;
        info["system_info"]        = llama_print_system_info();
        return info;
    }, "What this build is made of: versions, the pinned llama.cpp, CPU features in use.");
}
