// y[m, n] = scale[n] * sum_k x[m, k] * q[n, k] (+ b[n]): int8 weights with one fp32 scale per
// output row, fp32 activations and accumulation. Decoding reads every weight once per step and
// is bound by memory bandwidth, so halving the bytes of bf16 halves the time; the weight widens
// to fp32 in registers (no activation quantization, so the result is the dequantized matmul up
// to summation order). linear_int8w_a16 (int8 targets) quantizes the inputs to int16 first and
// multiplies in integers: cheaper verification, see int16_inputs.h.
#include "int8_gemm.h"
#include "int16_inputs.h"
#include "torch_linear.h"

// Both ops: x [..., K] (bf16 or fp32), q [N, K] (or packed [N/8, K, 8] for linear_int8w).
torch::Tensor linear_int8w(torch::Tensor x, torch::Tensor q, torch::Tensor scale, c10::optional<torch::Tensor> bias) {
  const int64_t K = x.size(-1), N = tandem_int8::check_weight(q, scale, K);
  return tandem_torch::linear(x, N, bias, [&](const float* X, int64_t M, const float* B, float* O) {
    tandem_int8::linear_into_any(X, M, K, q, scale.data_ptr<float>(), B, N, O);
  });
}

torch::Tensor linear_int8w_a16(torch::Tensor x, torch::Tensor q, torch::Tensor scale, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(q.dim() == 2, "int16 inputs need the row layout [N, K]");
  const int64_t K = x.size(-1), N = tandem_int8::check_weight(q, scale, K);
  return tandem_torch::linear(x, N, bias, [&](const float* X, int64_t M, const float* B, float* O) {
    tandem_a16::linear_into(X, M, K, q.data_ptr<int8_t>(), scale.data_ptr<float>(), B, N, O);
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // Release the GIL while computing: the Qt window's thread must keep running during a step.
  m.def("linear_int8w", &linear_int8w, "int8-weight linear with per-row scales, fp32 accumulation",
        py::call_guard<py::gil_scoped_release>());
  m.def("linear_int8w_a16", &linear_int8w_a16, "int8-weight linear on int16-quantized inputs (int8 targets)",
        py::call_guard<py::gil_scoped_release>());
  m.def("a16_isa", &tandem_a16::tile_set,
        "which tiles linear_int8w_a16 runs (for widths that are a multiple of 32)");
  m.def("a16_allow_vnni", [](bool on) { tandem_a16::vnni_enabled() = on; },
        "let linear_int8w_a16 use the AVX-512 VNNI tiles where the CPU has them (tests turn it off)");
}
