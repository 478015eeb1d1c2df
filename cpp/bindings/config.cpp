// Settings (llama_opt_settings), the field table and the feature table.

#include "bindings.h"

#include "base/config.h"

#include <pybind11/stl.h>

static const char * kind_name(llama_opt_value_kind kind) {
    switch (kind) {
        case llama_opt_value_kind::boolean: return "bool";
        case llama_opt_value_kind::uint:    return "int";
        case llama_opt_value_kind::real:    return "float";
        case llama_opt_value_kind::text:    return "str";
    }
    return "?";
}

static py::object typed_value(const llama_opt_config & c, const llama_opt_field & f) {
    switch (f.kind) {
        case llama_opt_value_kind::boolean: return py::bool_(c.*(f.as_bool));
        case llama_opt_value_kind::uint:    return py::int_(c.*(f.as_uint));
        case llama_opt_value_kind::real:    return py::float_(c.*(f.as_real));
        case llama_opt_value_kind::text:    return py::str(c.*(f.as_text));
    }
    return py::none();
}

static llama_opt_source parse_source(const std::string & name) {
    if (name == "environment") {
        return llama_opt_source::environment;
    }
    if (name == "argument") {
        return llama_opt_source::argument;
    }
    return llama_opt_source::default_value;
}

void register_config(py::module_ & m) {
    py::class_<llama_opt_settings>(m, "Settings", "Effective configuration and the source of each value.")
        .def(py::init<>(), "Compile-time defaults only.")
        .def_static("from_env", &llama_opt_settings::from_env, py::arg("env"), py::arg("other_names") = std::vector<std::string>{},
                    "Defaults, then every LLAMA_OPT_* variable of `env` (unknown names are errors).")
        .def("set", [](llama_opt_settings & s, const std::string & name, const std::string & text, const std::string & source) {
                 s.set(name, text, parse_source(source));
             }, py::arg("name"), py::arg("text"), py::arg("source") = "argument")
        .def("get", &llama_opt_settings::get, py::arg("name"), "The value as text.")
        .def("source_of", [](const llama_opt_settings & s, const std::string & name) {
                 return std::string(llama_opt_source_name(s.source_of(name)));
             }, py::arg("name"))
        .def("values", [](const llama_opt_settings & s) {
                 py::dict out;
                 for (const auto & f : llama_opt_fields()) {
                     out[f.name] = typed_value(s.config, f);
                 }
                 return out;
             }, "Every field's value, typed.");

    m.def("fields", [] {
        py::list out;
        for (const auto & f : llama_opt_fields()) {
            py::dict d;
            d["name"] = f.name;
            d["env"]  = f.env;
            d["type"] = kind_name(f.kind);
            d["min"]  = f.min;
            d["max"]  = f.max;
            d["help"] = f.help;
            d["choices"] = f.choices ? f.choices : "";
            d["default"] = typed_value(llama_opt_config_default(), f);
            out.append(d);
        }
        return out;
    }, "The configurable values: name, variable, type, limits, help, choices (\"a|b\": a text field taking one of them, \"|a|b\": or \"\"; \"\": any), compile-time default.");

    m.def("features", [] {
        py::list out;
        for (const auto & f : llama_opt_features()) {
            py::dict d;
            d["name"]          = f.name;
            d["cmake_switch"]  = f.cmake_switch;
            d["enabled_field"] = f.enabled_field;
            d["tier"]          = f.tier;
            d["compiled"]      = f.compiled;
            d["implemented"]   = f.implemented;
            d["no_effect"]     = f.no_effect;
            out.append(d);
        }
        return out;
    }, "The optimizations: compiled into this build? implemented in this version? if not, why it has no effect.");
}
