// loom's C++ exceptions as Python classes, the message unchanged (PYTHON_API.md "Errors").
#include "common.h"
#include "tree.h"

namespace loom::py {
namespace {

struct Classes {
  PyObject *error, *shape, *dtype, *trace, *autodiff, *compile, *exec, *parse, *dist, *warning;
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

// Most derived first: one translator keeps the C++ hierarchy's order.
void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const CallbackError& e) {
    e.restore();
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
}

PyObject* builtin_class(nb::exception_type t) {
  switch (t) {
    case nb::exception_type::stop_iteration: return PyExc_StopIteration;
    case nb::exception_type::index_error: return PyExc_IndexError;
    case nb::exception_type::key_error: return PyExc_KeyError;
    case nb::exception_type::value_error: return PyExc_ValueError;
    case nb::exception_type::type_error: return PyExc_TypeError;
    case nb::exception_type::buffer_error: return PyExc_BufferError;
    case nb::exception_type::import_error: return PyExc_ImportError;
    case nb::exception_type::attribute_error: return PyExc_AttributeError;
    default: return PyExc_RuntimeError;
  }
}

// loom's warnings as Python warnings (filterable, shown once per place by default).
void warn_in_python(const std::string& message) {
  nb::gil_scoped_acquire gil;
  if (PyErr_WarnEx(classes.warning, message.c_str(), 1) != 0) PyErr_Clear();  // an error filter
}

// The user's line for ops that note their site: the innermost frame outside the package.
std::optional<CallSite> python_user_site() {
  if (!PyGILState_Check()) return std::nullopt;  // a thread running no Python (GIL released)
  CallSite s = python_site();
  if (s.line == 0) return std::nullopt;
  return s;
}

}  // namespace

void set_python_error() noexcept {
  try {
    throw;
  } catch (nb::python_error& e) {
    e.restore();
  } catch (const CallbackError& e) {
    e.restore();
  } catch (const nb::builtin_exception& e) {
    PyErr_SetString(builtin_class(e.type()), e.what());
  } catch (const Error&) {
    translate(std::current_exception(), nullptr);
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_SystemError, "an unknown C++ exception");
  }
}

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
  c.warning = PyErr_NewExceptionWithDoc(
      "loom.LoomWarning", "A pattern that makes loom slow or large (a pending graph that grows).",
      PyExc_UserWarning, nullptr);
  if (!c.warning) throw nb::python_error();
  m.attr("LoomWarning") = nb::handle(c.warning);
  nb::register_exception_translator(translate);
  detail::set_warning_handler(warn_in_python);
  detail::set_user_site_hook(python_user_site);
}

}  // namespace loom::py
