// oneDNN baselines: the MLP step's products alone on oneDNN's matmul primitive, threaded by
// oneDNN itself (OpenMP, every core), the library loom's own products run on.
#include <dnnl.hpp>
#include <thread>

#include "bench.h"

extern "C" void omp_set_num_threads(int);

namespace loom::bench {

namespace {

using dnnl::memory;
using Dims = memory::dims;

// C[m,n] = A[m,k] B[k,n] with the operands' strides, a primitive made once.
struct Product {
  memory a, b, c;
  dnnl::matmul prim;
  Product(const dnnl::engine& eng, const Dims& a_dims, const Dims& a_strides, const Dims& b_dims,
          const Dims& b_strides, float* pa, float* pb, float* pc)
      : a({a_dims, memory::data_type::f32, a_strides}, eng, pa),
        b({b_dims, memory::data_type::f32, b_strides}, eng, pb),
        c({{a_dims[0], b_dims[1]}, memory::data_type::f32, memory::format_tag::ab}, eng, pc),
        prim(dnnl::matmul::primitive_desc(
            dnnl::matmul::desc(a.get_desc(), b.get_desc(), c.get_desc()), eng)) {}
  void run(dnnl::stream& s) {
    prim.execute(s, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
  }
};

}  // namespace

double mlp_onednn_products_seconds() {
  double best = 1e30;
  // A thread of its own: OpenMP's thread count there is the default one, whatever loom's
  // products set on the threads that ran them.
  std::thread([&best] {
    omp_set_num_threads(hardware_threads());
    MlpProducts m;
    const int64_t b = MlpProducts::b, in = MlpProducts::in, hid = MlpProducts::hid,
                  out = MlpProducts::out;
    auto& [x, w1, w2, h, lg, dw2, dh, dw1] = m;
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream s(eng);
    Product p[] = {
        {eng, {b, in}, {in, 1}, {in, hid}, {1, in}, x.data(), w1.data(), h.data()},  // x W1^T
        {eng, {b, hid}, {hid, 1}, {hid, out}, {1, hid}, h.data(), w2.data(), lg.data()},
        {eng, {out, b}, {1, out}, {b, hid}, {hid, 1}, lg.data(), h.data(), dw2.data()},  // dY^T h
        {eng, {b, out}, {out, 1}, {out, hid}, {hid, 1}, lg.data(), w2.data(), dh.data()},
        {eng, {hid, b}, {1, hid}, {b, in}, {in, 1}, dh.data(), x.data(), dw1.data()},  // dh^T x
    };
    best = MlpProducts::best_step_seconds([&] {
      for (Product& q : p) q.run(s);
      s.wait();
    });
  }).join();
  return best;
}

}  // namespace loom::bench
