// Stats (llama_opt_stats): one read-only attribute per counter.

#include "bindings.h"

#include "base/stats.h"

void register_stats(py::module_ & m) {
    py::class_<llama_opt_stats> cls(m, "Stats", R"doc(
Counters of the optimization layer and of the engine's work.

    stats = session.stats
    stats.tokens_prefilled, stats.forward_passes
    stats.as_dict()
)doc");
    cls.def(py::init<>());
    for (const auto & f : llama_opt_stats_fields()) {
        auto member = f.member;
        cls.def_property_readonly(f.name, [member](const llama_opt_stats & s) { return s.*member; });
    }
    cls.def("as_dict", [](const llama_opt_stats & s) {
           py::dict d;
           for (const auto & f : llama_opt_stats_fields()) {
               d[f.name] = s.*(f.member);
           }
           return d;
       }, "Every counter by name.")
       .def("reset", &llama_opt_stats::reset, "Set every counter to zero (of this copy).")
       .def("__sub__", &llama_opt_stats::operator-, "Counters of an interval: later - earlier.")
       .def("__add__", [](llama_opt_stats a, const llama_opt_stats & b) { return a += b; })
       .def("__eq__", [](const llama_opt_stats & a, const llama_opt_stats & b) {
           for (const auto & f : llama_opt_stats_fields()) {
               if (a.*(f.member) != b.*(f.member)) {
                   return false;
               }
           }
           return true;
       })
       .def("__str__", &llama_opt_stats::to_string)
       .def("__repr__", [](const llama_opt_stats & s) { return "<Stats\n" + s.to_string() + ">"; });
}
