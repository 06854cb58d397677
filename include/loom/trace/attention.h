// Scaled dot-product attention with torch's signature and semantics
// (torch.nn.functional.scaled_dot_product_attention):
//     Tensor y = loom::scaled_dot_product_attention(q, k, v, {.is_causal = true});
// q [..., L, E], k [..., S, E], v [..., S, Ev] -> [..., L, Ev]; batch dims broadcast. One
// definition shared by nn::CausalSelfAttention, loom.nn.functional and the Python layers.
#pragma once

#include <optional>

#include "loom/trace/tensor.h"

namespace loom {

struct SdpaOptions {
  // Boolean (true: the key takes part) or additive, of q's dtype; broadcast to [..., L, S].
  Tensor attn_mask;
  double dropout_p = 0;  // applied to the attention weights whenever > 0, as torch
  // Query i sees keys j <= i (torch's top-left alignment when L != S); with attn_mask, both
  // apply (as torch's CPU kernels).
  bool is_causal = false;
  std::optional<double> scale;  // default 1 / sqrt(E)
  // k and v may have fewer heads (dim -3) than q, each shared by Hq / Hk consecutive q heads.
  bool enable_gqa = false;
};

// A query row whose keys are all masked out gives zeros (torch >= 2.5), with finite gradients.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const SdpaOptions& opts = {});

// Multi-head attention of packed projections, the attention layers' middle step: qkv
// [B, T, 3 d] holds q, k and v (in that order) of `heads` heads of d / heads features each;
// returns [B, T, d], the heads joined. Causal unless told otherwise.
Tensor packed_qkv_attention(const Tensor& qkv, int64_t heads, bool is_causal = true);

}  // namespace loom
