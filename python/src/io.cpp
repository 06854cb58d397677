// Checkpoints: safetensors files (loom/nn/nn.h), read and written by the C++ core with the
// GIL released. python/loom/_io.py checks the arguments and gives the functions their names.
#include <loom/nn/nn.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>

#include "common.h"
#include "tree.h"

namespace loom::py {

void register_io(nb::module_& m) {
  m.def(
      "_save_safetensors",
      [](const std::map<std::string, Tensor>& tensors, const std::string& path,
         const std::map<std::string, std::string>& metadata) {
        const CallSite site = python_site();  // names the one graph the save runs
        nb::gil_scoped_release release;
        nn::save_safetensors(tensors, path, metadata, site);
      },
      nb::arg("tensors"), nb::arg("path"), nb::arg("metadata"));
  m.def("_load_safetensors", &nn::load_safetensors, nb::arg("path"),
        nb::call_guard<nb::gil_scoped_release>());
  m.def("_load_safetensors_metadata", &nn::load_safetensors_metadata, nb::arg("path"),
        nb::call_guard<nb::gil_scoped_release>());
}

}  // namespace loom::py
