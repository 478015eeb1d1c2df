// Maps llama_opt_error to the exception classes of pyllamaopt/errors.py.

#include "bindings.h"

#include "llama-opt.h"

static const char * exception_name(llama_opt_errc code) {
    switch (code) {
        case llama_opt_errc::config:              return "ConfigError";
        case llama_opt_errc::feature_unavailable: return "FeatureUnavailableError";
        case llama_opt_errc::model_load:          return "ModelLoadError";
        case llama_opt_errc::invalid_token:       return "InvalidTokenError";
        case llama_opt_errc::context_overflow:    return "ContextOverflowError";
        case llama_opt_errc::session_closed:      return "SessionClosedError";
        case llama_opt_errc::session_evicted:     return "SessionEvictedError";
        case llama_opt_errc::decode_failed:       return "DecodeError";
        case llama_opt_errc::invalid_argument:    return "InvalidArgumentError";
        case llama_opt_errc::grammar:             return "GrammarError";
    }
    return "PyllamaoptError";
}

void register_errors(py::module_ & /*m*/) {
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) {
                std::rethrow_exception(p);
            }
        } catch (const llama_opt_error & e) {
            py::object cls = py::module_::import("pyllamaopt.errors").attr(exception_name(e.code));
            py::object exc = cls(e.what());
            exc.attr("variable") = e.variable.empty() ? py::none() : py::object(py::str(e.variable));
            PyErr_SetObject(cls.ptr(), exc.ptr());
        }
    });
}
