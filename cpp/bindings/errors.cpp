// Maps llama_opt_error to the exception classes of pyllamaopt/errors.py.

#include "bindings.h"

#include "base/types.h"

#include <pybind11/gil_safe_call_once.h>

#include <array>
#include <cstddef>
#include <iterator>
#include <utility>

// Each llama_opt_errc and the class of pyllamaopt/errors.py it is raised as; any other code
// raises PyllamaoptError.
static constexpr std::pair<llama_opt_errc, const char *> exception_names[] = {
    { llama_opt_errc::config,              "ConfigError" },
    { llama_opt_errc::feature_unavailable, "FeatureUnavailableError" },
    { llama_opt_errc::model_load,          "ModelLoadError" },
    { llama_opt_errc::invalid_token,       "InvalidTokenError" },
    { llama_opt_errc::context_overflow,    "ContextOverflowError" },
    { llama_opt_errc::session_closed,      "SessionClosedError" },
    { llama_opt_errc::session_evicted,     "SessionEvictedError" },
    { llama_opt_errc::decode_failed,       "DecodeError" },
    { llama_opt_errc::invalid_argument,    "InvalidArgumentError" },
    { llama_opt_errc::grammar,             "GrammarError" },
    { llama_opt_errc::chat_template,       "ChatTemplateError" },
};
static constexpr size_t n_exception_names = std::size(exception_names);

// The classes in the order of exception_names, then PyllamaoptError.
using exception_classes = std::array<py::object, n_exception_names + 1>;

// Looked up once (register_errors does it when _core is imported), then kept for the process.
static const exception_classes & classes() {
    PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<exception_classes> storage;
    return storage
        .call_once_and_store_result([] {
            py::module_       errors = py::module_::import("pyllamaopt.errors");
            exception_classes out;
            for (size_t i = 0; i < n_exception_names; ++i) {
                out[i] = errors.attr(exception_names[i].second);
            }
            out[n_exception_names] = errors.attr("PyllamaoptError");
            return out;
        })
        .get_stored();
}

static py::handle exception_class(llama_opt_errc code) {
    size_t i = 0;
    while (i < n_exception_names && exception_names[i].first != code) {
        ++i;
    }
    return classes()[i];
}

void register_errors(py::module_ & /*m*/) {
    classes();  // import pyllamaopt.errors now, not while translating an exception
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) {
                std::rethrow_exception(p);
            }
        } catch (const llama_opt_error & e) {
            py::handle cls = exception_class(e.code);
            py::object exc = cls(e.what());
            exc.attr("variable") = e.variable.empty() ? py::none() : py::object(py::str(e.variable));
            PyErr_SetObject(cls.ptr(), exc.ptr());
        }
    });
}
