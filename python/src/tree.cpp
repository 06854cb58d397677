// Pytrees: flatten, unflatten, paths, static leaves as cache keys, the Python call site.
#include "tree.h"

#include <frameobject.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace loom::py {

PyRef::~PyRef() {
  if (!p_ || !nb::is_alive()) return;  // the interpreter is gone: leak, never touch it
  if (PyGILState_Check()) {            // the common case: no GIL state switch (~130 instructions)
    Py_DECREF(p_);
    return;
  }
  nb::gil_scoped_acquire gil;
  Py_DECREF(p_);
}

namespace {

bool is_namedtuple(nb::handle h) {
  return PyTuple_Check(h.ptr()) && !PyTuple_CheckExact(h.ptr()) &&
         PyObject_HasAttrString(reinterpret_cast<PyObject*>(Py_TYPE(h.ptr())), "_fields");
}

std::shared_ptr<PyRef> ref(nb::handle h) { return std::make_shared<PyRef>(h); }

void add_type(std::string* sig, nb::handle type) {
  *sig += reinterpret_cast<PyTypeObject*>(type.ptr())->tp_name;
  *sig += '@';
  *sig += std::to_string(reinterpret_cast<uintptr_t>(type.ptr()));
}

// A dict node's keys (a tuple, in iteration order) and type. Its aux is (keys, type), or, for
// a call's kwargs dict (made by Python for the call, alive and unchanged while the call
// runs, and the only tree node that may hold it), the dict itself: a cached call builds no
// key tuple.
nb::tuple dict_keys(const TreeDef::Node& n) {
  PyObject* a = n.aux->get().ptr();
  if (!PyDict_Check(a)) return nb::borrow<nb::tuple>(PyTuple_GET_ITEM(a, 0));
  nb::tuple keys = nb::steal<nb::tuple>(PyTuple_New(PyDict_GET_SIZE(a)));
  PyObject *key, *value;
  Py_ssize_t pos = 0, k = 0;
  while (PyDict_Next(a, &pos, &key, &value))
    PyTuple_SET_ITEM(keys.ptr(), k++, nb::handle(key).inc_ref().ptr());
  return keys;
}
nb::handle dict_type(const TreeDef::Node& n) {
  PyObject* a = n.aux->get().ptr();
  if (!PyDict_Check(a)) return PyTuple_GET_ITEM(a, 1);
  return reinterpret_cast<PyObject*>(Py_TYPE(a));
}

void walk(nb::handle h, TreeDef* def, std::vector<Tensor>* leaves, bool call_kwargs = false) {
  PyObject* o = h.ptr();
  TreeDef::Node node{TreeDef::kStatic};
  if (nb::isinstance<Tensor>(h)) {
    node.kind = TreeDef::kTensor;
    leaves->push_back(nb::cast<const Tensor&>(h));
    ++def->tensors;
    def->signature += 'T';
    def->nodes.push_back(std::move(node));
    return;
  }
  if (o == Py_None) {
    node.kind = TreeDef::kNone;
    def->signature += 'N';
    def->nodes.push_back(std::move(node));
    return;
  }
  if (PyTuple_Check(o) || PyList_Check(o)) {
    const bool list = PyList_Check(o);
    const bool named = !list && is_namedtuple(h);
    node.kind = list ? TreeDef::kList : named ? TreeDef::kNamed : TreeDef::kTuple;
    const Py_ssize_t n = list ? PyList_GET_SIZE(o) : PyTuple_GET_SIZE(o);
    node.arity = static_cast<uint32_t>(n);
    if (named) {
      node.aux = ref(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(o))));
      add_type(&def->signature, node.aux->get());
    }
    def->signature += list ? '[' : '(';
    def->nodes.push_back(std::move(node));
    for (Py_ssize_t k = 0; k < n; ++k) {
      walk(list ? PyList_GET_ITEM(o, k) : PyTuple_GET_ITEM(o, k), def, leaves);
      def->signature += ',';
    }
    def->signature += list ? ']' : ')';
    return;
  }
  if (PyDict_Check(o)) {
    node.kind = TreeDef::kDict;
    node.arity = static_cast<uint32_t>(PyDict_GET_SIZE(o));
    nb::tuple keys;
    if (!call_kwargs) keys = nb::steal<nb::tuple>(PyTuple_New(node.arity));
    nb::handle type = nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(o)));
    if (!PyDict_CheckExact(o)) add_type(&def->signature, type);
    def->signature += '{';
    const size_t at = def->nodes.size();
    def->nodes.push_back(std::move(node));
    PyObject *key, *value;
    Py_ssize_t pos = 0, k = 0;
    while (PyDict_Next(o, &pos, &key, &value)) {
      if (!PyUnicode_Check(key))
        throw nb::type_error(("pytree: a dict key must be a string, got " +
                              std::string(Py_TYPE(key)->tp_name) + " " +
                              nb::repr(nb::handle(key)).c_str())
                                 .c_str());
      if (!call_kwargs) PyTuple_SET_ITEM(keys.ptr(), k++, nb::handle(key).inc_ref().ptr());
      Py_ssize_t len = 0;
      const char* text = PyUnicode_AsUTF8AndSize(key, &len);
      def->signature += std::to_string(len);
      def->signature += ':';
      def->signature.append(text, static_cast<size_t>(len));
      walk(value, def, leaves);
      def->signature += ',';
    }
    def->signature += '}';
    def->nodes[at].aux = call_kwargs ? ref(h) : ref(nb::make_tuple(keys, type));
    return;
  }
  node.aux = ref(h);
  ++def->statics;
  def->signature += 'S';
  def->nodes.push_back(std::move(node));
}

nb::object build(const TreeDef& def, size_t* node, const std::vector<Tensor>& leaves, size_t* pos) {
  const TreeDef::Node& n = def.nodes[(*node)++];
  switch (n.kind) {
    case TreeDef::kTensor: return nb::cast(leaves[(*pos)++]);
    case TreeDef::kNone: return nb::none();
    case TreeDef::kStatic: return nb::borrow(n.aux->get());
    case TreeDef::kList: {
      nb::list l;
      for (uint32_t k = 0; k < n.arity; ++k) l.append(build(def, node, leaves, pos));
      return l;
    }
    case TreeDef::kTuple:
    case TreeDef::kNamed: {
      nb::object t = nb::steal(PyTuple_New(n.arity));
      for (uint32_t k = 0; k < n.arity; ++k)
        PyTuple_SET_ITEM(t.ptr(), k, build(def, node, leaves, pos).release().ptr());
      if (n.kind == TreeDef::kNamed) return n.aux->get()(*t);
      return t;
    }
    case TreeDef::kDict: {
      nb::tuple keys = dict_keys(n);
      nb::handle type = dict_type(n);
      nb::dict d;
      for (uint32_t k = 0; k < n.arity; ++k)
        d[nb::handle(PyTuple_GET_ITEM(keys.ptr(), k))] = build(def, node, leaves, pos);
      if (type.ptr() == reinterpret_cast<PyObject*>(&PyDict_Type)) return d;
      return type(d);
    }
  }
  return nb::none();
}

// Calls leaf(node index, path) for every leaf, in order.
template <class Leaf>
void walk_paths(const TreeDef& def, size_t* node, const std::string& path, const Leaf& leaf) {
  const size_t at = (*node)++;
  const TreeDef::Node& n = def.nodes[at];
  switch (n.kind) {
    case TreeDef::kTensor:
    case TreeDef::kStatic: leaf(at, path); return;
    case TreeDef::kNone: return;
    case TreeDef::kList:
    case TreeDef::kTuple:
      for (uint32_t k = 0; k < n.arity; ++k)
        walk_paths(def, node, path + "[" + std::to_string(k) + "]", leaf);
      return;
    case TreeDef::kNamed: {
      nb::tuple fields = nb::borrow<nb::tuple>(nb::getattr(n.aux->get(), "_fields"));
      for (uint32_t k = 0; k < n.arity; ++k)
        walk_paths(def, node, path + "." + nb::cast<std::string>(fields[k]), leaf);
      return;
    }
    case TreeDef::kDict: {
      nb::tuple keys = dict_keys(n);
      for (uint32_t k = 0; k < n.arity; ++k)
        walk_paths(
            def, node,
            path + "['" + nb::cast<std::string>(nb::handle(PyTuple_GET_ITEM(keys.ptr(), k))) + "']",
            leaf);
      return;
    }
  }
}

void text(const TreeDef& def, size_t* node, std::string* out) {
  const TreeDef::Node& n = def.nodes[(*node)++];
  auto children = [&](const char* open, const char* close, nb::handle keys) {
    *out += open;
    for (uint32_t k = 0; k < n.arity; ++k) {
      if (k) *out += ", ";
      if (keys.is_valid())
        *out += std::string(nb::repr(nb::handle(PyTuple_GET_ITEM(keys.ptr(), k))).c_str()) + ": ";
      text(def, node, out);
    }
    if (n.arity == 1 && std::string_view(open) == "(") *out += ",";
    *out += close;
  };
  switch (n.kind) {
    case TreeDef::kTensor: *out += "Tensor"; return;
    case TreeDef::kNone: *out += "None"; return;
    case TreeDef::kStatic: *out += nb::repr(n.aux->get()).c_str(); return;
    case TreeDef::kList: return children("[", "]", nb::handle());
    case TreeDef::kTuple: return children("(", ")", nb::handle());
    case TreeDef::kNamed:
      *out += reinterpret_cast<PyTypeObject*>(n.aux->get().ptr())->tp_name;
      return children("(", ")", nb::handle());
    case TreeDef::kDict: return children("{", "}", dict_keys(n));
  }
}

// Static values compare by type and ==; the GIL is taken because a compile step compares
// signatures with it released.
bool static_equal(const void* a, const void* b) {
  PyObject* x = static_cast<const PyRef*>(a)->get().ptr();
  PyObject* y = static_cast<const PyRef*>(b)->get().ptr();
  if (x == y) return true;
  nb::gil_scoped_acquire gil;
  if (Py_TYPE(x) != Py_TYPE(y)) return false;
  const int r = PyObject_RichCompareBool(x, y, Py_EQ);
  if (r < 0) {
    PyErr_Clear();
    return false;
  }
  return r == 1;
}

std::string static_print(const void* a) {
  nb::gil_scoped_acquire gil;
  return nb::repr(static_cast<const PyRef*>(a)->get()).c_str();
}

struct PyStatic {};  // the type tag of Python static values

}  // namespace

std::shared_ptr<const TreeDef> flatten(nb::handle tree, std::vector<Tensor>* leaves) {
  auto def = std::make_shared<TreeDef>();
  walk(tree, def.get(), leaves);
  return def;
}

void flatten_call(nb::handle args, nb::handle kwargs, TreeDef* def, std::vector<Tensor>* leaves) {
  def->nodes.reserve(8);
  def->signature.reserve(32);
  leaves->reserve(4);
  def->nodes.push_back(TreeDef::Node{TreeDef::kTuple, 2, nullptr});
  def->signature += '(';
  walk(args, def, leaves);
  def->signature += ',';
  walk(kwargs, def, leaves, /*call_kwargs=*/PyDict_CheckExact(kwargs.ptr()));
  def->signature += ",)";
}

nb::object unflatten(const TreeDef& def, const std::vector<Tensor>& leaves, size_t* pos) {
  size_t node = 0;
  return build(def, &node, leaves, pos);
}

std::vector<std::string> leaf_paths(const TreeDef& def, const std::string& prefix) {
  std::vector<std::string> paths;
  size_t node = 0;
  walk_paths(def, &node, prefix, [&](size_t at, const std::string& path) {
    if (def.nodes[at].kind == TreeDef::kTensor) paths.push_back(path);
  });
  return paths;
}

std::string structure_text(const TreeDef& def) {
  std::string out;
  size_t node = 0;
  text(def, &node, &out);
  return out;
}

std::string call_path(const std::string& path) {
  if (path.rfind("[0]", 0) == 0) return "args" + path.substr(3);
  if (path.rfind("[1]", 0) == 0) return "kwargs" + path.substr(3);
  return path;
}

void call_statics(const TreeDef& def, const char* what, std::vector<detail::StaticArg>* out) {
  if (def.statics == 0) return;
  size_t index = 0;
  for (const TreeDef::Node& n : def.nodes) {
    if (n.kind != TreeDef::kStatic) continue;
    PyObject* v = n.aux->get().ptr();
    const Py_hash_t h = PyObject_Hash(v);
    if (h == -1) {
      PyErr_Clear();
      std::string path;
      size_t node = 0, k = 0;
      walk_paths(def, &node, "", [&](size_t at, const std::string& p) {
        if (def.nodes[at].kind == TreeDef::kStatic && k++ == index) path = p;
      });
      throw nb::type_error(detail::str_cat(what, ": argument ", call_path(path), " is a ",
                                           Py_TYPE(v)->tp_name,
                                           ", neither a tensor, a pytree (dict, list, tuple, "
                                           "namedtuple, None) nor a hashable static value; "
                                           "pass arrays as tensors (loom.from_numpy)")
                               .c_str());
    }
    detail::StaticArg a;
    a.hash =
        static_cast<size_t>(h) ^ (reinterpret_cast<uintptr_t>(Py_TYPE(v)) * 0x9e3779b97f4a7c15ULL);
    a.type = &typeid(PyStatic);
    a.value = n.aux;
    a.equal = &static_equal;
    a.print = &static_print;
    a.arg = index++;
    out->push_back(std::move(a));
  }
}

namespace {
std::mutex site_mu;                  // python_site's tables and the directories below
std::vector<std::string> skip_dirs;  // skip_frames_under's
uint32_t skip_generation = 1;        // bumped by each new directory
}  // namespace

void skip_frames_under(std::string dir) {
  std::lock_guard<std::mutex> lock(site_mu);
  if (std::find(skip_dirs.begin(), skip_dirs.end(), dir) != skip_dirs.end()) return;
  skip_dirs.push_back(std::move(dir));
  ++skip_generation;
}

CallSite python_site() {
  // Per code object (the table holds a reference to each, so an address is never reused):
  // its file and function names, interned, and whether its file is under a skipped directory.
  // A site costs a walk of the frames and one lookup per frame; no string is built or compared
  // after a code's first call (or the first after a new skipped directory).
  struct Names {
    const char* file;
    const char* function;
    std::unordered_map<int, int> line_at;  // bytecode offset -> line (decoding costs ~3k instr)
    uint32_t skip_generation = 0;          // `skipped` holds for this generation of skip_dirs
    bool skipped = false;
  };
  static std::unordered_set<std::string> interned;  // node-based: element addresses are stable
  static std::unordered_map<PyCodeObject*, Names> by_code;
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  Py_XINCREF(frame);
  std::lock_guard<std::mutex> lock(site_mu);
  while (frame) {  // the innermost frame outside the skipped directories
    PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
    auto it = by_code.find(code);
    if (it == by_code.end()) {
      const char* file = PyUnicode_AsUTF8(code->co_filename);
      if (!file) PyErr_Clear();
      const char* func = PyUnicode_AsUTF8(code->co_name);
      if (!func) PyErr_Clear();
      Names n;
      n.file = interned.emplace(file ? file : "<python>").first->c_str();
      n.function = interned.emplace(func ? func : "<python>").first->c_str();
      Py_INCREF(code);  // the table's reference
      it = by_code.emplace(code, std::move(n)).first;
    }
    Py_DECREF(code);
    Names& n = it->second;
    if (n.skip_generation != skip_generation) {
      n.skipped = false;
      for (const std::string& d : skip_dirs)
        n.skipped = n.skipped || std::string_view(n.file).substr(0, d.size()) == d;
      n.skip_generation = skip_generation;
    }
    if (!n.skipped) {
      auto [at, fresh] = n.line_at.try_emplace(PyFrame_GetLasti(frame), 0);
      if (fresh) at->second = PyFrame_GetLineNumber(frame);
      Py_DECREF(frame);
      return CallSite(n.file, n.function, static_cast<uint32_t>(at->second));
    }
    PyFrameObject* back = PyFrame_GetBack(frame);  // new reference
    Py_DECREF(frame);
    frame = back;
  }
  return CallSite("<python>", "<module>", 0);
}

}  // namespace loom::py
