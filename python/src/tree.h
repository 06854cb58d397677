// Pytrees of Python values for the tracing tools: tensors, dict (string keys), list, tuple,
// namedtuple and None, nested freely; any other leaf (a number, a string, an enum, a module)
// is static, part of a cache key, hashed and compared by value and by type. Flattening runs
// in C++ so that a cached assume_pure or compile call runs no Python beyond it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common.h"

namespace loom::py {

// A strong reference that may be dropped without the GIL (a compile cache, a worker thread):
// it takes the GIL to decrement, and leaks the reference once the interpreter is finalizing.
class PyRef {
 public:
  PyRef() = default;
  explicit PyRef(nb::handle h) : p_(h.inc_ref().ptr()) {}
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  ~PyRef();
  nb::handle get() const { return p_; }

 private:
  PyObject* p_ = nullptr;
};

// The structure of a flattened tree, in preorder: every node with its kind, its number of
// children and, for a dict its keys, a namedtuple or dict subclass its type, a static leaf its
// value. `signature` spells the structure (static values by position) for a cache key.
struct TreeDef {
  enum Kind : uint8_t { kTensor, kNone, kTuple, kList, kDict, kNamed, kStatic };
  struct Node {
    Kind kind;
    uint32_t arity = 0;
    std::shared_ptr<PyRef> aux;  // dict: tuple of keys; named: the type; static: the value
  };
  std::vector<Node> nodes;
  size_t tensors = 0;  // tensor leaves
  size_t statics = 0;  // static leaves
  std::string signature;
};

// Flattens `tree` into its tensor leaves (appended to *leaves) and its structure. `what` names
// the API and argument in errors ("scan: init"). Raises TypeError for a dict with a non-string
// key. Static leaves are kept in the structure (their hash is taken by call_statics).
std::shared_ptr<const TreeDef> flatten(nb::handle tree, std::vector<Tensor>* leaves);
// Flattens a call's arguments as the tree (args, kwargs) into *def.
void flatten_call(nb::handle args, nb::handle kwargs, TreeDef* def, std::vector<Tensor>* leaves);
// Rebuilds a tree of the structure with the tensors leaves[*pos...] (advancing *pos).
nb::object unflatten(const TreeDef& def, const std::vector<Tensor>& leaves, size_t* pos);
inline nb::object unflatten(const TreeDef& def, const std::vector<Tensor>& leaves) {
  size_t pos = 0;
  return unflatten(def, leaves, &pos);
}
// The tree paths of the tensor leaves, in order: prefix + "[0]['x'].field".
std::vector<std::string> leaf_paths(const TreeDef& def, const std::string& prefix);
// The structure as readable text: "(T, {'a': T, 'b': 3})".
std::string structure_text(const TreeDef& def);

// A path of the call tree (args, kwargs) as the user reads it: "[0][1]['x']" -> "args[1]['x']".
std::string call_path(const std::string& path);

// The static leaves of `def` as the cache key's static arguments (Python hash and ==, the
// type compared exactly: 1, 1.0 and True are different keys). Raises TypeError naming the
// leaf's path when a static leaf is not hashable.
void call_statics(const TreeDef& def, const char* what, std::vector<detail::StaticArg>* out);

// The Python caller of the running binding (file and line of the innermost Python frame),
// for error messages and graph names; the strings live as long as the process.
// Frames of files under the directories given to skip_frames_under (the loom package's, at
// import; torch's, when loom.torch is imported) are skipped.
CallSite python_site();
void skip_frames_under(std::string dir);

// The Python caller as the user's site of what runs in its scope: a read releases the GIL, so
// the frames cannot be walked from inside it (graph names, run-time errors' trace sites).
class PythonSite {
 public:
  PythonSite() : site_(python_site()), scope_(site_) {}

 private:
  CallSite site_;
  detail::UserSite scope_;
};

}  // namespace loom::py
