// The CPU backend: fused loop kernels generated with LLVM 19 (linked with RuntimeDyld), matrix
// products through OpenBLAS, parallel loops on a persistent thread pool, buffers from a caching
// pool. The default backend; LOOM_BACKEND=ref selects the reference interpreter instead.
#pragma once

#include <memory>

#include "loom/backend/backend.h"

namespace loom::backend {

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace loom::backend
