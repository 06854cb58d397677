// loom's C++ exceptions as Python classes, the message unchanged (PYTHON_API.md "Errors").
#include "common.h"

namespace loom::py {
namespace {

struct Classes {
  PyObject *error, *shape, *dtype, *trace, *autodiff, *compile, *exec, *parse, *dist;
};
Classes classes;

PyObject* make(nb::module_& m, const char* name, const char* doc, PyObject* base,
               PyObject* also = nullptr) {
  std::string full = std::string("loom.") + name;
  nb::object bases =
      also ? nb::object(nb::make_tuple(nb::handle(base), nb::handle(also))) : nb::borrow(base);
  PyObject* cls = PyErr_NewExceptionWithDoc(full.c_str(), doc, bases.ptr(), nullptr);
  if (!cls) throw nb::python_error();
  m.attr(name) = nb::handle(cls);
  return cls;
}

}  // namespace

void register_errors(nb::module_& m) {
  Classes& c = classes;
  c.error = make(m, "Error", "Every error loom raises (the C++ loom::Error's message).",
                 PyExc_RuntimeError);
  c.shape = make(m, "ShapeError", "Shapes that do not fit the op (also a ValueError).", c.error,
                 PyExc_ValueError);
  c.dtype = make(m, "DTypeError", "A dtype the op does not take (also a TypeError).", c.error,
                 PyExc_TypeError);
  c.trace = make(m, "TraceError",
                 "A misuse of tracing: a value read inside a traced body, a tensor used on "
                 "another thread or outside its body, a changed loop structure.",
                 c.error);
  c.autodiff =
      make(m, "AutodiffError", "A gradient loom cannot take (through while_loop, ...).", c.error);
  c.compile = make(m, "CompileError", "The backend could not compile a graph.", c.error);
  c.exec = make(m, "ExecError", "A compiled graph failed while running.", c.error);
  c.parse = make(m, "ParseError", "Malformed IR text or file.", c.error);
  c.dist = make(m, "DistError",
                "A distributed run that cannot go on: ranks that run different graphs, a dead "
                "or missing rank, a collective past its timeout.",
                c.error);
  // Most derived first: one translator keeps the C++ hierarchy's order.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const ShapeError& e) {
      PyErr_SetString(classes.shape, e.what());
    } catch (const DTypeError& e) {
      PyErr_SetString(classes.dtype, e.what());
    } catch (const TraceError& e) {
      PyErr_SetString(classes.trace, e.what());
    } catch (const AutodiffError& e) {
      PyErr_SetString(classes.autodiff, e.what());
    } catch (const CompileError& e) {
      PyErr_SetString(classes.compile, e.what());
    } catch (const ExecError& e) {
      PyErr_SetString(classes.exec, e.what());
    } catch (const ParseError& e) {
      PyErr_SetString(classes.parse, e.what());
    } catch (const DistError& e) {
      PyErr_SetString(classes.dist, e.what());
    } catch (const Error& e) {
      PyErr_SetString(classes.error, e.what());
    }
  });
}

}  // namespace loom::py
