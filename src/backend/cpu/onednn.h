// Products on oneDNN's matmul primitive (float32), with a product's folded elementwise
// consumers as post-ops (plan.h: Step::post). The primitives are built when the program is
// compiled and kept with it; the product is split into parts (batches, row or column ranges)
// run on loom's thread pool, one single-threaded oneDNN call per part, as loom splits
// OpenBLAS products: oneDNN's OpenMP threads are never started, so they never spin beside
// the pool (docs/architecture.md, "Products"). No oneDNN header here: only onednn.cpp
// and onednn_parts.cpp see it (through onednn_impl.h).
//
// Thread-safety: an OnednnProduct is immutable after make_onednn_product; several threads may
// run it at once (each part call takes its own stream, memory objects and scratchpad).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/plan.h"

namespace loom::cpu {

struct OnednnProduct;

// The primitives and parts of MatMul step `st` (st.lib == Library::Onednn) of `plan`.
// Primitives with the same descriptor are shared through a process-wide table.
std::shared_ptr<const OnednnProduct> make_onednn_product(const ir::Graph& g, const Plan& plan,
                                                         const Step& st);
// Runs it on the plan's buffer table.
void run_onednn(const OnednnProduct& prod, void* const* ptr);
// Its tasks one at a time, for a caller that schedules them itself (no pool).
int64_t onednn_tasks(const OnednnProduct& prod);
void run_onednn_task(const OnednnProduct& prod, void* const* ptr, int64_t t);
const std::string& onednn_name(const OnednnProduct& prod);
// Whether `prod` runs its post-ops inside oneDNN (false: loom's epilogue applies them to each
// part's block after the product, because it is faster for them or oneDNN refused them; tests
// check this).
bool onednn_fused(const OnednnProduct& prod);
// For tests: every product's post-ops (all but a bias, which the primitive adds) in loom's
// epilogue. Affects products made after the call.
bool epilogues_everywhere();
void set_epilogues_everywhere(bool on);
// Row parts: task t writes rows [bounds[t], bounds[t + 1]) of C, every column, in one pass;
// empty when the tasks split C otherwise (columns, batches of their own).
std::vector<int64_t> onednn_row_bounds(const OnednnProduct& prod);
// How a product in row parts reads buffer `buf` of `elems` floats: not at all, or only at the
// rows each task writes of C (A or a binary operand read row by row from the buffer's start,
// rows of the same length as the buffer's), or otherwise (B, a broadcast, a strided read).
enum class RowRead { None, SameRows, Other };
RowRead onednn_row_read(const OnednnProduct& prod, int buf, int64_t elems);
// "gemm:jit, 2 parts" (and ", post-ops in loom's epilogue" when not fused): for LOOM_DEBUG=2.
std::string onednn_describe(const OnednnProduct& prod);

}  // namespace loom::cpu
