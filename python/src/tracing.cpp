// The tracing tools with Python callables and pytrees: assume_pure, compile, scan, while_loop,
// fori_loop, on the C++ core's flat entry points (loom/trace/control_flow.h, compile.h). The
// arguments are flattened in C++ (tree.h); a cached call runs no Python beyond that. A Python
// exception raised by the traced function unwinds through the core (which pops the body's
// scope) and reaches the caller as itself, with its traceback.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "common.h"
#include "tree.h"

namespace loom::py {
namespace {

using TreePtr = std::shared_ptr<const TreeDef>;

// The call's arguments as one tree: (args, kwargs). Leaf paths read "args[0]['x']" and
// "kwargs['lr']".
struct Call {
  TreeDef def;
  detail::CallKey key;
};

std::vector<std::string> call_paths(const void* p) {
  nb::gil_scoped_acquire gil;  // a compile step looks up with the GIL released
  const TreeDef& def = *static_cast<const TreeDef*>(p);
  std::vector<std::string> paths = leaf_paths(def, "");
  for (std::string& s : paths) s = call_path(s);
  return paths;
}

// Fills c (not movable: the key points at its tree).
void make_call(const char* what, const nb::args& args, const nb::kwargs& kwargs, Call* c) {
  flatten_call(args, kwargs, &c->def, &c->key.leaves);
  c->key.signature = std::move(c->def.signature);  // the tree is only unflattened after
  call_statics(c->def, what, &c->key.statics);
  c->key.args = &c->def;
  c->key.paths_of = &call_paths;
}

// The function's result flattened; its structure goes to *like for unflattening the outputs.
std::vector<Tensor> flat_result(nb::handle result, std::shared_ptr<const void>* like) {
  std::vector<Tensor> out;
  *like = flatten(result, &out);
  return out;
}

nb::object unflatten_like(const std::shared_ptr<const void>& like, const std::vector<Tensor>& out) {
  return unflatten(*static_cast<const TreeDef*>(like.get()), out);
}

// Calls fn(*rebuilt[0], **rebuilt[1]) for a call tree rebuilt with the body's parameters.
nb::object call_rebuilt(nb::handle fn, const TreeDef& def, const std::vector<Tensor>& params) {
  nb::object rebuilt = unflatten(def, params);
  nb::tuple parts = nb::borrow<nb::tuple>(rebuilt);
  return fn(*parts[0], **parts[1]);
}

// Loop carries and scanned inputs: tensors and structure only (a number would be a constant of
// the body, fixed at its first value).
TreePtr tensor_tree(nb::handle tree, const char* api, const char* what,
                    std::vector<Tensor>* leaves) {
  TreePtr def = flatten(tree, leaves);
  if (def->statics) {
    throw nb::type_error(detail::str_cat(api, ": ", what,
                                         " must be a pytree of tensors (dict, "
                                         "list, tuple, namedtuple, None), got ",
                                         structure_text(*def),
                                         "; make numbers tensors (loom.tensor(x))")
                             .c_str());
  }
  return def;
}

// ---- assume_pure -----------------------------------------------------------------------------

struct PureFunction {
  nb::object fn;
  std::shared_ptr<detail::PureCache> cache;
};

nb::object pure_call(PureFunction& self, nb::args args, nb::kwargs kwargs) {
  Call c;
  make_call("assume_pure", args, kwargs, &c);
  std::shared_ptr<const void> like;
  const TreeDef& def = c.def;
  detail::FlatFn trace = [&](const std::vector<Tensor>& params) {
    return flat_result(call_rebuilt(self.fn, def, params), &like);
  };
  std::vector<Tensor> out = detail::pure_call(*self.cache, std::move(c.key), trace, &like);
  return unflatten_like(like, out);
}

// ---- loom.torch's assume_pure ------------------------------------------------------------------

// lt.assume_pure's cached call (python/loom/torch/_tools.py) without its Python: for a call
// whose argument types and keyword names a call before had, with nothing to differentiate and
// one tensor result, the LoomTensor arguments (of type `wrapper`) give their `_elem`, the loom
// function runs and `wrap` makes the result a LoomTensor. Other calls run `slow`, the Python
// path, which appends (pure function, argument count, keyword names, argument types) to
// `learned` for the calls this path can take. (The ~1.5 us of Python around a 2.7 us call.)
struct TorchPure {
  nb::object slow, wrapper, wrap, grad_enabled, any_requires_grad, learned;
  struct Signature {
    nb::object pure;                // a PureFunction
    Py_ssize_t nargs = 0;           // positional arguments
    std::vector<nb::object> names;  // keyword names, in order
    std::vector<nb::object> types;  // each argument's type, positional then keyword
  };
  static constexpr size_t kMaxSignatures = 16;
  std::vector<Signature> sigs;

  const Signature* find(PyObject* args, PyObject* kwargs) const {
    const Py_ssize_t na = PyTuple_GET_SIZE(args), nk = kwargs ? PyDict_GET_SIZE(kwargs) : 0;
    for (const Signature& s : sigs) {
      if (s.nargs != na || static_cast<Py_ssize_t>(s.names.size()) != nk) continue;
      bool same = true;
      for (Py_ssize_t k = 0; k < na && same; ++k)
        same = reinterpret_cast<PyObject*>(Py_TYPE(PyTuple_GET_ITEM(args, k))) == s.types[k].ptr();
      Py_ssize_t pos = 0, i = 0;
      PyObject *key, *value;
      while (same && kwargs && PyDict_Next(kwargs, &pos, &key, &value)) {
        PyObject* name = s.names[i].ptr();
        same = (key == name || PyUnicode_Compare(key, name) == 0) &&
               reinterpret_cast<PyObject*>(Py_TYPE(value)) == s.types[na + i].ptr();
        ++i;
      }
      if (same) return &s;
    }
    return nullptr;
  }
  void learn() {
    while (PyList_GET_SIZE(learned.ptr()) > 0) {
      nb::tuple t = nb::borrow<nb::tuple>(learned[0]);
      PyList_SetSlice(learned.ptr(), 0, 1, nullptr);
      if (sigs.size() == kMaxSignatures) continue;
      Signature s;
      s.pure = nb::borrow(t[0]);
      s.nargs = nb::cast<Py_ssize_t>(t[1]);
      for (nb::handle n : nb::borrow<nb::tuple>(t[2])) s.names.push_back(nb::borrow(n));
      for (nb::handle ty : nb::borrow<nb::tuple>(t[3])) s.types.push_back(nb::borrow(ty));
      sigs.push_back(std::move(s));
    }
  }
};

nb::object torch_pure_call(TorchPure& self, nb::args args, nb::kwargs kwargs) {
  const TorchPure::Signature* sig = self.find(args.ptr(), kwargs.ptr());
  auto slow = [&] {
    nb::object r = self.slow(*args, **kwargs);
    self.learn();
    return r;
  };
  if (!sig) return slow();
  const Py_ssize_t na = PyTuple_GET_SIZE(args.ptr());
  nb::object flat = nb::steal(PyTuple_New(na + static_cast<Py_ssize_t>(sig->names.size())));
  for (Py_ssize_t k = 0; k < na; ++k) {
    PyObject* a = PyTuple_GET_ITEM(args.ptr(), k);
    Py_INCREF(a);
    PyTuple_SET_ITEM(flat.ptr(), k, a);
  }
  Py_ssize_t pos = 0, i = na;
  PyObject *key, *value;
  while (PyDict_Next(kwargs.ptr(), &pos, &key, &value)) {
    Py_INCREF(value);
    PyTuple_SET_ITEM(flat.ptr(), i++, value);
  }
  if (nb::object g = self.grad_enabled(); g.ptr() == Py_True) {
    nb::object any = nb::steal(PyObject_Call(self.any_requires_grad.ptr(), flat.ptr(), nullptr));
    if (!any.is_valid()) throw nb::python_error();
    if (any.ptr() == Py_True) return slow();
  }
  static PyObject* const elem = PyUnicode_InternFromString("_elem");
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(flat.ptr()); ++k) {
    PyObject* a = PyTuple_GET_ITEM(flat.ptr(), k);
    if (reinterpret_cast<PyObject*>(Py_TYPE(a)) != self.wrapper.ptr()) continue;
    PyObject* e = PyObject_GetAttr(a, elem);
    if (!e) throw nb::python_error();
    PyTuple_SET_ITEM(flat.ptr(), k, e);  // steals e, releases the wrapper's reference
    Py_DECREF(a);
  }
  nb::object pure = sig->pure;  // sigs may grow (and move) while the function traces
  nb::object outs =
      pure_call(nb::cast<PureFunction&>(pure), nb::borrow<nb::args>(flat), nb::kwargs());
  return self.wrap(outs[0]);
}

// ---- compile ---------------------------------------------------------------------------------

struct CompiledFunction {
  nb::object fn;
  std::shared_ptr<detail::StepCache> cache;
};

nb::object step_call(CompiledFunction& self, nb::args args, nb::kwargs kwargs) {
  Call c;
  make_call("compile", args, kwargs, &c);
  std::shared_ptr<const void> like;
  detail::FlatFn trace = [&](const std::vector<Tensor>&) {
    nb::gil_scoped_acquire gil;
    return flat_result(self.fn(*args, **kwargs), &like);
  };
  std::vector<Tensor> out;
  {
    nb::gil_scoped_release release;  // compiling and running the step
    out = detail::run_step(*self.cache, std::move(c.key), trace, &like);
  }
  return unflatten_like(like, out);
}

// ---- scan ------------------------------------------------------------------------------------

nb::tuple as_pair(nb::handle r, const char* api) {
  if ((!PyTuple_Check(r.ptr()) && !PyList_Check(r.ptr())) || nb::len(r) != 2)
    throw nb::type_error(detail::str_cat(api, ": the body must return a pair (new_carry, y), got ",
                                         "a ", Py_TYPE(r.ptr())->tp_name,
                                         PyTuple_Check(r.ptr()) || PyList_Check(r.ptr())
                                             ? detail::str_cat(" of length ", nb::len(r))
                                             : std::string())
                             .c_str());
  return nb::tuple(r);
}

void check_structure(const detail::Site& site, const char* what, const TreeDef& before,
                     const TreeDef& after) {
  if (before.signature != after.signature || after.statics)
    detail::structure_changed(site, what, structure_text(before), structure_text(after));
}

nb::tuple scan(nb::callable fn, nb::handle init, nb::handle xs, bool reverse,
               std::optional<int64_t> length, bool remat) {
  const detail::Site site{"scan", "body", python_site()};
  std::vector<Tensor> init_leaves, xs_leaves;
  TreePtr init_def = tensor_tree(init, "scan", "init", &init_leaves);
  TreePtr xs_def = tensor_tree(xs, "scan", "xs", &xs_leaves);
  const size_t nc = init_leaves.size();
  TreePtr y_def;
  detail::FlatFn flat = [&](const std::vector<Tensor>& p) {
    std::vector<Tensor> cp(p.begin() + 1, p.begin() + 1 + static_cast<long>(nc));
    std::vector<Tensor> xp(p.begin() + 1 + static_cast<long>(nc), p.end());
    nb::tuple r = as_pair(fn(unflatten(*init_def, cp), unflatten(*xs_def, xp)), "scan");
    std::vector<Tensor> out;
    TreePtr carry = flatten(r[0], &out);
    check_structure(site, "carry", *init_def, *carry);
    std::vector<Tensor> ys;
    y_def = tensor_tree(r[1], "scan", "the body's y", &ys);
    out.insert(out.end(), ys.begin(), ys.end());
    return out;
  };
  ScanOptions opts;
  opts.reverse = reverse;
  opts.length = length.value_or(-1);
  opts.remat = remat;
  std::vector<Tensor> res =
      detail::scan_flat(site, opts, flat, init_leaves, leaf_paths(*init_def, "carry"), xs_leaves,
                        leaf_paths(*xs_def, "xs"));
  std::vector<Tensor> carry(res.begin(), res.begin() + static_cast<long>(nc));
  std::vector<Tensor> ys(res.begin() + static_cast<long>(nc), res.end());
  return nb::make_tuple(unflatten(*init_def, carry), unflatten(*y_def, ys));
}

// ---- while_loop, fori_loop -------------------------------------------------------------------

// The carried values as a tuple: the body may return a lone value when one is carried.
nb::object as_carried(nb::handle r, size_t count) {
  if (count == 1 && !PyTuple_Check(r.ptr())) return nb::make_tuple(r);
  if (PyList_Check(r.ptr())) return nb::tuple(r);
  return nb::borrow(r);
}

nb::tuple carried_tuple(nb::handle carried, const char* api) {
  if (!PyTuple_Check(carried.ptr()) && !PyList_Check(carried.ptr()))
    throw nb::type_error(detail::str_cat(api,
                                         ": argument 'carried' must be a tuple of the "
                                         "carried values, got ",
                                         Py_TYPE(carried.ptr())->tp_name)
                             .c_str());
  return nb::tuple(carried);
}

nb::object while_loop(nb::callable cond, nb::callable body, nb::handle carried_in) {
  const detail::Site site{"while_loop", "body", python_site()};
  nb::tuple carried = carried_tuple(carried_in, "while_loop");
  std::vector<Tensor> leaves;
  TreePtr def = tensor_tree(carried, "while_loop", "carried", &leaves);
  const size_t count = nb::len(carried);
  detail::FlatFn flat_cond = [&](const std::vector<Tensor>& p) {
    nb::object r = cond(*unflatten(*def, p));
    if (!nb::isinstance<Tensor>(r))
      throw nb::type_error(detail::str_cat("while_loop: cond must return a bool scalar tensor, "
                                           "got ",
                                           Py_TYPE(r.ptr())->tp_name)
                               .c_str());
    return std::vector<Tensor>{nb::cast<Tensor>(r)};
  };
  detail::FlatFn flat_body = [&](const std::vector<Tensor>& p) {
    nb::object r = as_carried(body(*unflatten(*def, p)), count);
    std::vector<Tensor> out;
    TreePtr next = flatten(r, &out);
    check_structure(site, "carried values", *def, *next);
    return out;
  };
  return unflatten(
      *def, detail::while_flat(site, flat_cond, flat_body, leaves, leaf_paths(*def, "carried")));
}

// A bound: a Python int, or an integer scalar tensor (the loop is then a while loop).
LoopBound bound(nb::handle b, const char* name) {
  if (nb::isinstance<Tensor>(b)) return LoopBound(nb::cast<Tensor>(b));
  if (PyLong_Check(b.ptr()) && !PyBool_Check(b.ptr())) return LoopBound(nb::cast<int64_t>(b));
  if (PyFloat_Check(b.ptr())) return LoopBound(nb::cast<double>(b));
  throw nb::type_error(detail::str_cat("fori_loop: argument '", name,
                                       "' must be an int or an integer scalar tensor, got ",
                                       Py_TYPE(b.ptr())->tp_name)
                           .c_str());
}

nb::object single(nb::object t, size_t count) {
  if (count == 1) return nb::borrow(nb::tuple(t)[0]);
  return t;
}

nb::object fori_loop(nb::handle lower_in, nb::handle upper_in, nb::callable body,
                     nb::args carried) {
  const detail::Site site{"fori_loop", "body", python_site()};
  if (carried.size() == 0)
    throw nb::type_error("fori_loop: carry at least one value (fori_loop(lower, upper, body, x))");
  LoopBound lower = bound(lower_in, "lower"), upper = bound(upper_in, "upper");
  std::vector<Tensor> leaves;
  TreePtr def = tensor_tree(carried, "fori_loop", "carried", &leaves);
  const size_t count = carried.size();
  auto step = [&](const Tensor& i, const std::vector<Tensor>& c) {
    nb::object r = as_carried(body(i, *unflatten(*def, c)), count);
    std::vector<Tensor> out;
    TreePtr next = flatten(r, &out);
    check_structure(site, "carried values", *def, *next);
    return out;
  };
  if (detail::fori_static(lower, upper)) {
    detail::FlatFn flat = [&](const std::vector<Tensor>& p) {
      return step(detail::fori_index(p[0], lower), std::vector<Tensor>(p.begin() + 1, p.end()));
    };
    ScanOptions opts;
    opts.length = std::max<int64_t>(0, upper.value - lower.value);
    return single(unflatten(*def, detail::scan_flat(site, opts, flat, leaves,
                                                    leaf_paths(*def, "carried"), {}, {})),
                  count);
  }
  Tensor lo = lower.tensor.defined() ? lower.tensor : loom::tensor(lower.value);
  Tensor hi = upper.tensor.defined() ? upper.tensor : loom::tensor(upper.value);
  std::vector<Tensor> all{loom::to(lo, DType::Int64)};
  all.insert(all.end(), leaves.begin(), leaves.end());
  std::vector<std::string> paths{"index"};
  for (std::string& p : leaf_paths(*def, "carried")) paths.push_back(std::move(p));
  detail::FlatFn flat_cond = [&](const std::vector<Tensor>& p) {
    return std::vector<Tensor>{p[0] < hi};
  };
  detail::FlatFn flat_body = [&](const std::vector<Tensor>& p) {
    std::vector<Tensor> out{p[0] + int64_t{1}};
    std::vector<Tensor> next = step(p[0], std::vector<Tensor>(p.begin() + 1, p.end()));
    out.insert(out.end(), next.begin(), next.end());
    return out;
  };
  std::vector<Tensor> res = detail::while_flat(site, flat_cond, flat_body, all, paths);
  return single(unflatten(*def, std::vector<Tensor>(res.begin() + 1, res.end())), count);
}

// A wrapper used as a method binds `self` as a function does (self is then a static argument).
nb::object bind_to(nb::handle self, nb::handle obj, nb::handle) {
  if (obj.is_none()) return nb::borrow(self);
  return nb::steal(PyMethod_New(self.ptr(), obj.ptr()));
}

// ---- custom_vjp ------------------------------------------------------------------------------

// fn(*args) with bwd as its backward: the positional arguments flattened (numbers and other
// non-tensor leaves stay fixed), fwd's (out, residuals) and bwd's one gradient tree (or None)
// per argument flattened against them.
nb::object custom_vjp_call(nb::callable fn, nb::callable fwd, nb::callable bwd, nb::args args) {
  std::vector<Tensor> leaves;
  TreePtr def = flatten(args, &leaves);
  std::vector<size_t> arg_leaves;  // tensor leaves per positional argument
  for (nb::handle a : args) {
    std::vector<Tensor> part;
    flatten(a, &part);
    arg_leaves.push_back(part.size());
  }
  std::shared_ptr<const void> out_like, res_like;
  auto call_with = [&](nb::handle f, const std::vector<Tensor>& params) {
    nb::tuple rebuilt = nb::borrow<nb::tuple>(unflatten(*def, params));
    return f(*rebuilt);
  };
  detail::FlatFn plain = [&](const std::vector<Tensor>& p) {
    return flat_result(call_with(fn, p), &out_like);
  };
  VjpForward forward = [&](const std::vector<Tensor>& p) {
    nb::object r = call_with(fwd, p);
    if (!PyTuple_Check(r.ptr()) || nb::len(r) != 2)
      throw nb::type_error("custom_vjp: fwd must return a pair (output, residuals)");
    std::pair<std::vector<Tensor>, std::vector<Tensor>> flat;
    out_like = flatten(r[0], &flat.first);
    res_like = flatten(r[1], &flat.second);
    return flat;
  };
  VjpBackward backward = [&](const std::vector<Tensor>& res, const std::vector<Tensor>& gs) {
    nb::object r = bwd(unflatten_like(res_like, res), unflatten_like(out_like, gs));
    if (!PyTuple_Check(r.ptr()) || nb::len(r) != arg_leaves.size())
      throw nb::type_error(detail::str_cat("custom_vjp: bwd must return a tuple of one gradient "
                                           "(or None) per positional argument: ",
                                           arg_leaves.size(), " here")
                               .c_str());
    std::vector<Tensor> grads;
    for (size_t k = 0; k < arg_leaves.size(); ++k) {
      std::vector<Tensor> part;
      if (!r[k].is_none()) flatten(r[k], &part);
      if (r[k].is_none()) part.resize(arg_leaves[k]);
      if (part.size() != arg_leaves[k])
        throw nb::type_error(detail::str_cat("custom_vjp: bwd's gradient ", k, " has ", part.size(),
                                             " tensor(s); argument ", k, " has ", arg_leaves[k])
                                 .c_str());
      grads.insert(grads.end(), part.begin(), part.end());
    }
    return grads;
  };
  std::vector<Tensor> out = CustomVjp(plain, forward, backward, python_site())(leaves);
  return unflatten_like(out_like, out);
}

}  // namespace

void register_tracing(nb::module_& m) {
  m.def("_skip_frames_under", &skip_frames_under,
        "Frames under this directory are not the user's (loom's, torch's): errors and graph "
        "names skip them.");
  nb::class_<PureFunction>(m, "PureFunction", nb::dynamic_attr(),
                           "A function traced once per signature (loom.assume_pure).")
      .def("__call__", &pure_call)
      .def("__get__", &bind_to);
  m.def(
      "_assume_pure",
      [](nb::callable fn, bool check_purity) {
        PureOptions opts;
        opts.check_purity = check_purity;
        return PureFunction{fn, detail::make_pure_cache(opts, python_site())};
      },
      nb::arg("fn"), nb::arg("check_purity") = false);

  nb::class_<TorchPure>(m, "_TorchPure", nb::dynamic_attr(),
                        "lt.assume_pure's callable: its cached calls in C++ (TorchPure).")
      .def("__init__",
           [](TorchPure* t, nb::object slow, nb::object wrapper, nb::object wrap,
              nb::object grad_enabled, nb::object any_requires_grad, nb::list learned) {
             new (t) TorchPure{slow, wrapper, wrap, grad_enabled, any_requires_grad, learned, {}};
           })
      .def("__call__", &torch_pure_call)
      .def("__get__", &bind_to);

  nb::class_<CompiledFunction>(m, "CompiledFunction", nb::dynamic_attr(),
                               "A step compiled as one graph per call (loom.compile).")
      .def("__call__", &step_call)
      .def("__get__", &bind_to);
  m.def(
      "_compile",
      [](nb::callable fn, std::optional<std::string> name, bool full_graph,
         std::optional<int> max_different_graphs, bool trace_once) {
        CompileOptions opts;
        opts.name = name.value_or("");
        opts.full_graph = full_graph;
        if (max_different_graphs) {
          if (*max_different_graphs < 1)
            throw nb::value_error(detail::str_cat("compile: max_different_graphs must be at "
                                                  "least 1 (or None for no limit), got ",
                                                  *max_different_graphs)
                                      .c_str());
          opts.max_different_graphs = *max_different_graphs;
        }
        opts.trace_once = trace_once;
        return CompiledFunction{fn, detail::make_step_cache(std::move(opts), python_site())};
      },
      nb::arg("fn"), nb::arg("name") = nb::none(), nb::arg("full_graph") = false,
      nb::arg("max_different_graphs") = nb::none(), nb::arg("trace_once") = false);

  m.def("_scan", &scan, nb::arg("fn"), nb::arg("init"), nb::arg("xs").none(),
        nb::arg("reverse") = false, nb::arg("length") = nb::none(), nb::arg("remat") = false);
  m.def("_while_loop", &while_loop, nb::arg("cond_fn"), nb::arg("body_fn"), nb::arg("carried"));
  m.def("_fori_loop", &fori_loop);
  m.def("_custom_vjp_call", &custom_vjp_call);
  m.def(
      "_tree_structure",
      [](nb::handle tree) {
        std::vector<Tensor> leaves;
        return structure_text(*flatten(tree, &leaves));
      },
      "The structure of a pytree as text (for tests and messages).");
}

}  // namespace loom::py
