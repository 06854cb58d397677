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
    const int64_t b = 64, in = 784, hid = 256, out = 10;
    HostRng rng(7);
    std::vector<float> x = rng.normal_vec(b * in, 1.0), w1 = rng.normal_vec(hid * in, 0.05),
                       w2 = rng.normal_vec(out * hid, 0.05), h(b * hid), lg(b * out),
                       dw2(out * hid), dh(b * hid), dw1(hid * in);
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream s(eng);
    Product p[] = {
        {eng, {b, in}, {in, 1}, {in, hid}, {1, in}, x.data(), w1.data(), h.data()},  // x W1^T
        {eng, {b, hid}, {hid, 1}, {hid, out}, {1, hid}, h.data(), w2.data(), lg.data()},
        {eng, {out, b}, {1, out}, {b, hid}, {hid, 1}, lg.data(), h.data(), dw2.data()},  // dY^T h
        {eng, {b, out}, {out, 1}, {out, hid}, {hid, 1}, lg.data(), w2.data(), dh.data()},
        {eng, {hid, b}, {1, hid}, {b, in}, {in, 1}, dh.data(), x.data(), dw1.data()},  // dh^T x
    };
    auto step = [&] {
      for (Product& q : p) q.run(s);
      s.wait();
    };
    for (int i = 0; i < 50; ++i) step();
    for (int rep = 0; rep < 5; ++rep) {
      const double t0 = seconds();
      for (int i = 0; i < 200; ++i) step();
      best = std::min(best, (seconds() - t0) / 200);
    }
  }).join();
  return best;
}

}  // namespace loom::bench
