// y = x . W^T (+ b) on a GGUF file's own blocks (Q4_0 .. Q8_0, Q4_K, Q5_K, Q6_K), reference.py's
// contract bit for bit: x quantized per block to int8 (gguf_inputs.h), exact int32 sums per
// block (gguf_formats_*.h), the fp32 steps per block in order, 8 weight rows at once
// (gguf_tiles.h). A row's bits never depend on how many rows share the call, nor on which
// tile set runs. Compiled with -ffp-contract=off: a fused multiply-add would round once where
// the contract (and torch) rounds twice.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "avx2_common.h"
#include "gguf_inputs.h"
#include "gguf_formats_avx2.h"
#include "gguf_formats_vnni.h"

namespace tandem_gguf {

inline bool& vnni_enabled() {
  static bool on = tandem_avx2::avx512_allowed_by_env();
  return on;
}

inline bool use_vnni() { return vnni_enabled() && tandem_avx2::cpu_has_avx512_vnni(); }

torch::Tensor linear(torch::Tensor x, torch::Tensor raw, int64_t qtype, int64_t N, int64_t K, c10::optional<torch::Tensor> bias) {
  const bool kquant = qtype == Q4_K || qtype == Q5_K || qtype == Q6_K;
  const int64_t QB = kquant ? 256 : 32;
  TORCH_CHECK(x.size(-1) == K && K % QB == 0, "gguf linear: input width must be the weight's, a multiple of its block");
  TORCH_CHECK(raw.scalar_type() == at::kByte && raw.dim() == 2 && raw.size(0) == N && raw.is_contiguous(),
              "gguf linear: raw weights must be contiguous uint8 [N, row_bytes]");
  auto out_shape = x.sizes().vec();
  out_shape.back() = N;
  auto xf = x.reshape({-1, K}).to(at::kFloat).contiguous();
  const int64_t M = xf.size(0);
  auto out = torch::empty({M, N}, xf.options());
  if (M == 0 || N == 0) return out.to(x.scalar_type()).reshape(out_shape);
  torch::Tensor bf;
  const float* B = nullptr;
  if (bias.has_value() && bias->defined()) {
    bf = bias->to(at::kFloat).contiguous();
    TORCH_CHECK(bf.numel() == N, "gguf linear: bias must have N values");
    B = bf.data_ptr<float>();
  }
  Inputs in;
  const bool vnni = use_vnni();
  quantize_inputs(xf.data_ptr<float>(), M, K, QB, in, vnni && (qtype == Q4_K || qtype == Q5_K));
  const bool done = vnni
      ? tandem_gguf_vnni::dispatch(qtype, tandem_gguf_vnni::Job{raw.data_ptr<uint8_t>(), raw.size(1), N, &in, B, out.data_ptr<float>()}, M)
      : tandem_gguf_avx2::dispatch(qtype, tandem_gguf_avx2::Job{raw.data_ptr<uint8_t>(), raw.size(1), N, &in, B, out.data_ptr<float>()}, M);
  TORCH_CHECK(done, "gguf linear: unsupported type ", qtype);
  return out.to(x.scalar_type()).reshape(out_shape);
}

}  // namespace tandem_gguf

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // Release the GIL while computing: the Qt window's thread must keep running during a step.
  m.def("linear", &tandem_gguf::linear, "GGUF-block linear, inputs quantized to int8 per block",
        py::call_guard<py::gil_scoped_release>());
  m.def("gguf_isa", []() { return std::string(tandem_avx2::tile_set_name(tandem_gguf::vnni_enabled())); },
        "which tiles run: avx512_vnni or avx2");
  m.def("gguf_allow_vnni", [](bool on) { tandem_gguf::vnni_enabled() = on; },
        "allow the AVX-512 VNNI tiles where the CPU has them (tests compare both on one machine)");
}
