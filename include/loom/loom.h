// The umbrella header of loom's public API: tensors, ops, sync, metrics and diagnostics.
#pragma once

#include "loom/core/dtype.h"
#include "loom/core/error.h"
#include "loom/core/profile.h"
#include "loom/core/shape.h"
#include "loom/dist/dist.h"
#include "loom/nn/nn.h"
#include "loom/nn/scan_layers.h"
#include "loom/optim/optim.h"
#include "loom/runtime/diagnostics.h"
#include "loom/runtime/metrics.h"
#include "loom/trace/autograd.h"
#include "loom/trace/compile.h"
#include "loom/trace/control_flow.h"
#include "loom/trace/ops.h"
#include "loom/trace/tensor.h"
#include "loom/trace/tree.h"
