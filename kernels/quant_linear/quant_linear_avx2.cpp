// y[m, n] = scale[n] * sum_k x[m, k] * q[n, k] (+ b[n]): int8 weights with one fp32 scale per
// output row, fp32 activations and accumulation. Decoding reads every weight once per step and
// is bound by memory bandwidth, so halving the bytes of bf16 halves the time; the weight widens
// to fp32 in registers (no activation quantization, so the result is the dequantized matmul up
// to summation order).
#include "int8_gemm.h"

torch::Tensor linear_int8w(torch::Tensor x, torch::Tensor q, torch::Tensor scale, c10::optional<torch::Tensor> bias) {
  const int64_t K = x.size(-1);
  const int64_t N = tandem_int8::check_weight(q, scale, K);
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
  tandem_int8::linear_into_any(xf.data_ptr<float>(), M, K, q, scale.data_ptr<float>(), B, N, out.data_ptr<float>());
  return out.to(x.scalar_type()).reshape(out_shape);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // Release the GIL while computing: the Qt window's thread must keep running during a step.
  m.def("linear_int8w", &linear_int8w, "int8-weight linear with per-row scales, fp32 accumulation",
        py::call_guard<py::gil_scoped_release>());
}
