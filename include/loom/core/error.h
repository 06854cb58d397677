// Error types and checking macros.
//
// Every user-facing mistake throws a loom::Error (or a child) whose message says where, what,
// what was expected and what was got: "[add] shapes do not broadcast: f32[3] and f32[4]".
// LOOM_CHECK(cond, parts...) throws for bad user input; LOOM_ASSERT(cond) aborts on a broken
// internal invariant. Thread-safe: everything here is stateless.
#pragma once

#include <cstdint>
#include <optional>
#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>

namespace loom {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class ShapeError : public Error {
 public:
  using Error::Error;
};
class DTypeError : public Error {
 public:
  using Error::Error;
};
class TraceError : public Error {
 public:
  using Error::Error;
};
class AutodiffError : public Error {
 public:
  using Error::Error;
};
class CompileError : public Error {
 public:
  using Error::Error;
};
class ExecError : public Error {
 public:
  using Error::Error;
  // An error of the IR op `op` ("index_select"): a failed read poisons only what depends on
  // that op (TraceContext::poison); without one, everything the run would have produced.
  ExecError(std::string op, const std::string& message) : Error(message), op_(std::move(op)) {}
  const std::string& op() const { return op_; }

 private:
  std::string op_;
};
// A distributed failure: ranks that ran different graphs, a rank that died or did not answer
// within the timeout, a store that never filled. The message names the op, the rank(s) and
// the timeout.
class DistError : public Error {
 public:
  using Error::Error;
};
// Malformed IR text; the message starts with "line:column:".
class ParseError : public Error {
 public:
  ParseError(int line, int column, const std::string& what)
      : Error(std::to_string(line) + ":" + std::to_string(column) + ": " + what),
        line_(line),
        column_(column) {}
  int line() const { return line_; }
  int column() const { return column_; }

 private:
  int line_, column_;
};

// Where a user called an API, for messages and graph names: from C++ the std::source_location
// (it converts implicitly), from Python the caller's file and line (python/ interns the strings).
// The strings must outlive the site: literals or interned.
struct CallSite {
  CallSite(const std::source_location& loc)  // NOLINT: implicit, as a default argument
      : file(loc.file_name()), function(loc.function_name()), line(loc.line()) {}
  CallSite(const char* file, const char* function, uint32_t line)
      : file(file), function(function), line(line) {}
  const char* file;
  const char* function;
  uint32_t line;
};

namespace detail {
template <class... Parts>
std::string str_cat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
[[noreturn]] void assert_fail(const char* cond, const char* file, int line);
// "model.cpp:42": a call site for messages and graph names (the file without its directory).
std::string file_line(const CallSite& site);
// A warning for the user: stderr ("[loom] warning: ..."), or the handler a front end installs
// (Python's warnings.warn). Not for errors: those throw.
void warn(const std::string& message);
using WarningHandler = void (*)(const std::string& message);
void set_warning_handler(WarningHandler handler);

// The user's call site, when a front end knows it better than an op's source_location (which
// names loom's own code when a composite or a binding calls the op). Python installs a hook
// that returns the innermost Python frame outside the loom package; nn::Module's call
// operator sets the outermost C++ one. Only ops that note a site for run-time errors ask.
using UserSiteHook = std::optional<CallSite> (*)();
void set_user_site_hook(UserSiteHook hook);
class UserSite {
 public:
  explicit UserSite(const CallSite& loc);  // the outermost one wins
  ~UserSite();
  UserSite(const UserSite&) = delete;
  UserSite& operator=(const UserSite&) = delete;

 private:
  bool set_ = false;
};
// The call site an op records: the user's when known, else `loc`.
CallSite user_site(const CallSite& loc);
}  // namespace detail

}  // namespace loom

// Throws ErrorType with the streamed parts when cond is false.
#define LOOM_CHECK_T(ErrorType, cond, ...)                   \
  do {                                                       \
    if (!(cond)) [[unlikely]]                                \
      throw ErrorType(::loom::detail::str_cat(__VA_ARGS__)); \
  } while (0)
#define LOOM_CHECK(cond, ...) LOOM_CHECK_T(::loom::Error, cond, __VA_ARGS__)
#define LOOM_ASSERT(cond)                                     \
  do {                                                        \
    if (!(cond)) [[unlikely]]                                 \
      ::loom::detail::assert_fail(#cond, __FILE__, __LINE__); \
  } while (0)
