// The torch side shared by the linear ops (kernels/linear, quant_linear, int4_linear): the input
// x [..., K] (bf16 or fp32) as contiguous fp32 rows [M, K], the bias (if any) as fp32, and the
// result [..., N] back in x's dtype.
#pragma once
#include <torch/extension.h>
#include <cstdint>

namespace tandem_torch {

// compute(X, M, B, O) fills O [M, N] from X [M, K] and B [N] (nullptr without a bias).
template <typename Compute>
torch::Tensor linear(const torch::Tensor& x, int64_t N, const c10::optional<torch::Tensor>& bias, Compute compute) {
  const int64_t K = x.size(-1);
  auto out_shape = x.sizes().vec();
  out_shape.back() = N;
  auto xf = x.reshape({-1, K}).to(at::kFloat).contiguous();
  const int64_t M = xf.size(0);
  auto out = torch::empty({M, N}, xf.options());
  torch::Tensor bf;
  const float* B = nullptr;
  if (bias.has_value() && bias->defined()) {
    bf = bias->to(at::kFloat).contiguous();
    B = bf.data_ptr<float>();
  }
  compute(static_cast<const float*>(xf.data_ptr<float>()), M, B, out.data_ptr<float>());
  return out.to(x.scalar_type()).reshape(out_shape);
}

}  // namespace tandem_torch
