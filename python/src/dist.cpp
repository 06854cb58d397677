// loom.distributed's core: the communicator (init from the environment or arguments) and the
// collectives as lazy graph ops. Blocking calls (init's rendezvous, barrier) release
// the GIL, as sync does.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "common.h"

namespace loom::py {
namespace {

dist::ReduceOp reduce_op(const std::string& op, const char* fn) {
  if (op == "sum") return dist::ReduceOp::Sum;
  if (op == "mean" || op == "avg") return dist::ReduceOp::Mean;
  if (op == "max") return dist::ReduceOp::Max;
  if (op == "min") return dist::ReduceOp::Min;
  throw nb::value_error(
      detail::str_cat(fn, "(): op must be 'sum', 'mean', 'max' or 'min', got '", op, "'").c_str());
}

void init(std::optional<int> rank, std::optional<int> world_size, std::optional<std::string> store,
          std::optional<std::string> address, std::optional<double> timeout) {
  dist::InitOptions o;
  if (rank) o.rank = *rank;
  if (world_size) o.world_size = *world_size;
  if (store) o.store = *store;
  if (address) o.address = *address;
  if (timeout) {
    if (!(*timeout > 0))
      throw nb::value_error("init(): timeout must be a positive number of seconds");
    o.timeout_s = *timeout;
  }
  nb::gil_scoped_release g;
  dist::init(o);
}

dist::Mesh mesh_of(const std::vector<int64_t>& shape, const std::vector<std::string>& names) {
  return dist::Mesh(shape, names);
}

}  // namespace

void register_dist(nb::module_& m) {
  // Sharding annotations (loom/trace/sharding.h); loom.distributed.Mesh holds the mesh.
  m.def(
      "_mark_sharding",
      [](const Tensor& t, const std::vector<int64_t>& shape, const std::vector<std::string>& names,
         const dist::ShardSpec& spec) { dist::mark_sharding(t, mesh_of(shape, names), spec); },
      nb::arg("tensor"), nb::arg("mesh_shape"), nb::arg("axis_names"), nb::arg("spec"));
  m.def(
      "_from_local",
      [](const Tensor& t, const std::vector<int64_t>& shape, const std::vector<std::string>& names,
         const dist::ShardSpec& spec) { return dist::from_local(t, mesh_of(shape, names), spec); },
      nb::arg("piece"), nb::arg("mesh_shape"), nb::arg("axis_names"), nb::arg("spec"));
  m.def("_sharding_of", &dist::sharding_of, nb::arg("tensor"));
  m.def("_full", &dist::full, nb::arg("tensor"));
  m.def("_sharding_report", &dist::sharding_report);
  m.def("_dist_init", &init, nb::arg("rank").none(), nb::arg("world_size").none(),
        nb::arg("store").none(), nb::arg("address").none(), nb::arg("timeout").none());
  m.def("_dist_finalize", [] {
    nb::gil_scoped_release g;
    dist::finalize();
  });
  m.def("_dist_initialized", &dist::initialized);
  m.def("_dist_rank", [] { return dist::rank(); });
  m.def("_dist_world_size", [] { return dist::world_size(); });
  m.def("_dist_barrier", [] {
    nb::gil_scoped_release g;
    dist::barrier();
  });
  m.def(
      "_all_reduce",
      [](const Tensor& t, const std::string& op, bool replicated) {
        return dist::all_reduce(t, reduce_op(op, "all_reduce"), replicated);
      },
      nb::arg("tensor"), nb::arg("op"), nb::arg("replicated"));
  m.def(
      "_all_gather",
      [](const Tensor& t, int64_t dim, bool replicated) {
        return dist::all_gather(t, dim, replicated);
      },
      nb::arg("tensor"), nb::arg("dim"), nb::arg("replicated"));
  m.def(
      "_reduce_scatter",
      [](const Tensor& t, int64_t dim, const std::string& op) {
        return dist::reduce_scatter(t, dim, reduce_op(op, "reduce_scatter"));
      },
      nb::arg("tensor"), nb::arg("dim"), nb::arg("op"));
  m.def("_broadcast", &dist::broadcast, nb::arg("tensor"), nb::arg("root"));
  m.def("_grad_all_reduce", &dist::grad_all_reduce, nb::arg("tensor"));
  m.def("_average_in_buckets", &dist::average_in_buckets, nb::arg("grads"),
        nb::arg("bucket_bytes"));
  m.def(
      "_column_parallel_linear",
      [](const Tensor& x, const Tensor& w, std::optional<Tensor> b, bool gather_output) {
        return dist::column_parallel_linear(x, w, b.value_or(Tensor()), gather_output);
      },
      nb::arg("input"), nb::arg("weight"), nb::arg("bias").none(), nb::arg("gather_output"));
  m.def(
      "_row_parallel_linear",
      [](const Tensor& x, const Tensor& w, std::optional<Tensor> b) {
        return dist::row_parallel_linear(x, w, b.value_or(Tensor()));
      },
      nb::arg("input"), nb::arg("weight"), nb::arg("bias").none());
}

}  // namespace loom::py
