// The extension module loom._loom: each binding file registers its area.
#include <dlfcn.h>

#include "common.h"
#include "index_key.h"

namespace loom::py {
void register_torch_ops(nb::module_& m);  // torch_ops.cpp
}

NB_MODULE(_loom, m) {
  m.doc() = "loom's C++ core; import the `loom` package instead";
  // Tensors that Python still holds at exit (module globals) are freed by the interpreter's
  // teardown order, not leaked; nanobind's report would be noise.
  nanobind::set_leak_warnings(false);
  // Generated code resolves helpers (libgcc's __truncdfhf2 and kin for float16) in the
  // process's global namespace; an executable has libgcc_s there, an extension module loaded
  // by Python (RTLD_LOCAL) does not, so promote it.
  dlopen("libgcc_s.so.1", RTLD_NOW | RTLD_GLOBAL);
  loom::py::register_errors(m);
  loom::py::register_tensor(m);
  loom::py::register_ops(m);
  loom::py::register_torch_ops(m);
  loom::py::register_interop(m);
  loom::py::register_callbacks(m);
  loom::py::register_transforms(m);
  loom::py::register_tracing(m);
  loom::py::register_io(m);
  loom::py::register_dist(m);
  loom::py::register_index_key(m);
}
