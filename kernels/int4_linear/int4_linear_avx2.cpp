// y[m, n] = sum_g scale[n, g] * dx[m, g] * (codes . xq)_g + offset[n, g] * xsum[m, g] (+ b[n]):
// int4 weights with an fp16 scale and offset per 32 (in panels of 4 rows), inputs quantized per 32 values to
// int8 (reference.py is the contract; llama.cpp's Q4_1 x Q8_1 recipe). The products are integer
// (vpmaddubsw / vpmaddwd): 32 weights cost ~10 instructions where widening them to fp32 cost
// ~22, so one decode row is bound by memory bandwidth again, and a verification block reuses
// each group's codes, already in registers, for every row.
// Each output is one FMA chain over the groups' exact integer sums in order (the VNNI tiles: four
// such chains, then a fixed-order sum): a row's bits never depend on how many rows share the call.
#include "int4_gemm.h"
#include "torch_linear.h"

torch::Tensor linear_int4w(torch::Tensor x, torch::Tensor packed, torch::Tensor scale, torch::Tensor offset,
                           c10::optional<torch::Tensor> bias) {
  const int64_t K = x.size(-1), N = tandem_int4::check_weight(packed, scale, offset, K);
  return tandem_torch::linear(x, N, bias, [&](const float* X, int64_t M, const float* B, float* O) {
    tandem_int4::linear_into(X, M, K, packed.data_ptr<uint8_t>(), tandem_int4::half_ptr(scale), tandem_int4::half_ptr(offset),
                             B, N, O);
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // Release the GIL while computing: the Qt window's thread must keep running during a step.
  m.def("linear_int4w", &linear_int4w, "int4-weight linear (scale, offset per 32), inputs quantized to int8 per 32",
        py::call_guard<py::gil_scoped_release>());
  m.def("int4_isa", &tandem_int4::tile_set, "which tiles run: avx512_vnni or avx2");
  m.def("int4_allow_vnni", [](bool on) { tandem_int4::vnni_enabled() = on; },
        "allow the AVX-512 VNNI tiles where the CPU has them (tests compare both on one machine)");
}
