// y[m, n] = sum_k x[m, k] * w[n, k] (+ b[n]) with w in bf16, accumulated in fp32.
// Each weight row is read once from memory and widened to fp32 in registers, then applied to
// every input row, so for small M the cost is one pass over the weights. Every output element is
// computed by the same instruction sequence whatever M is (batch invariance).
#include <torch/extension.h>
#include <cstdint>

#include "fp32_tiles.h"  // the tiles, shared with the int8 kernels
#include "torch_linear.h"

torch::Tensor linear_bf16w(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.dim() == 2 && w.is_contiguous(), "weight must be contiguous [N, K] bf16");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(x.size(-1) == K, "x last dim must equal K");
  const uint16_t* W = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  return tandem_torch::linear(x, N, bias, [&](const float* X, int64_t M, const float* B, float* O) {
    tandem_fp32::linear_into(tandem_fp32::Tiles<tandem_fp32::Bf16>{X, W, nullptr, B, O, K, N}, M, /*grain=*/64);
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // Release the GIL while computing: the Qt window's thread must keep running during a step.
  m.def("linear_bf16w", &linear_bf16w, "bf16-weight linear, fp32 accumulation, batch-invariant",
        py::call_guard<py::gil_scoped_release>());
}
