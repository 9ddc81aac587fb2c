// y = x . W^T (+ b) on a GGUF file's own blocks (Q4_0 .. Q8_0, Q4_K, Q5_K, Q6_K), reference.py's
// contract bit for bit: x quantized per block to int8 (gguf_inputs.h), exact int32 sums per
// block (gguf_formats_*.h), the fp32 steps per block in order, 8 weight rows at once
// (gguf_tiles.h), or on AVX-512 VNNI 16 at once for Q4_K / Q6_K against 6 or more input rows
// (gguf_prefill_vnni.h) or against any number from a copy laid out at load (gguf_rows16_vnni.h,
// where no AMX tiles run), or where the CPU has AMX-INT8 16 at once on its tiles against 64 or
// more (gguf_amx.h: a prompt's prefill chunk). A row's bits never depend on how many rows share the call, nor on
// which tiles run. Compiled with -ffp-contract=off: a fused multiply-add would round once where
// the contract (and torch) rounds twice.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <sys/mman.h>

#include "avx2_common.h"
#include "gguf_inputs.h"
#include "gguf_formats_avx2.h"
#include "gguf_formats_vnni.h"
#include "gguf_prefill_vnni.h"
#include "gguf_amx.h"

namespace tandem_gguf {

inline bool& vnni_enabled() {
  static bool on = tandem_avx2::avx512_allowed_by_env();
  return on;
}

inline bool use_vnni() { return vnni_enabled() && tandem_avx2::cpu_has_avx512_vnni(); }

// The tiles of 16 weight rows for many input rows (gguf_prefill_vnni.h); tests turn them off to
// compare their bits with the tiles of 8.
inline bool& prefill_enabled() {
  static bool on = true;
  return on;
}

// The AMX tiles (gguf_amx.h) where the CPU has them; tests turn them off to compare bits.
inline bool& amx_enabled() {
  static bool on = tandem_gguf_amx::amx_allowed_by_env();
  return on;
}

inline bool use_amx_tiles(bool vnni) { return vnni && amx_enabled() && tandem_gguf_amx::cpu_has_amx_int8(); }

// Input rows from which the AMX tiles take Q4_K / Q6_K: a prefill chunk of 512 rows runs 1.4x
// faster on them in the runner, but a verification of 16 rows ran slower than on the VNNI
// tiles (docs/benchmarks/log.md), so few rows stay there. Tests lower it to run every row count
// on them.
constexpr int64_t kAmxRows = 64;

inline int64_t& amx_rows() {
  static int64_t rows = kAmxRows;
  return rows;
}

// Whether M input rows take the AMX tiles for ``qtype``.
inline bool use_amx(bool vnni, int64_t qtype, int64_t M) {
  return M >= amx_rows() && tandem_gguf_vnni::prefill_type(qtype) && use_amx_tiles(vnni);
}

// Whether M input rows on the VNNI tiles take the prefill tiles for ``qtype``.
inline bool use_prefill(bool vnni, int64_t qtype, int64_t M) {
  return vnni && prefill_enabled() && M >= tandem_gguf_vnni::kPrefillRows && tandem_gguf_vnni::prefill_type(qtype) &&
         !use_amx(vnni, qtype, M);
}

inline const char* isa_name() { return use_amx_tiles(vnni_enabled()) ? "amx_int8" : tandem_avx2::tile_set_name(vnni_enabled()); }

// Whether the AVX2 tiles compute from the packed layouts they are given; tests and benchmarks
// turn it off to compare with the file's layout in one process.
inline bool& packed_enabled() {
  static bool on = true;
  return on;
}

// Whether the tiles in use lay Q4_K / Q6_K out again at load in groups of 16 rows (gguf_rows16_vnni.h):
// the VNNI tiles where no AMX tiles run (those read the file's rows, as the prefill of an AMX CPU
// would otherwise need both copies).
inline bool packs_rows16(bool vnni) { return vnni && !use_amx_tiles(vnni); }

// The weight laid out again at load (``pack``) for the tiles in use, where one was made: null
// otherwise (the tiles read the file's rows). A layout made for the other tile set (tests switch
// tile sets in one process) is not this one's: rows8 packs are 2-D, rows16 ones 3-D.
inline const uint8_t* packed_for(const torch::Tensor& packed, bool vnni, int64_t qtype, int64_t N, int64_t K) {
  if (!packed_enabled() || !packed.defined() || packed.numel() == 0) return nullptr;
  const bool rows16 = packed.dim() == 3;
  if (rows16 != vnni || (rows16 && !packs_rows16(vnni))) return nullptr;
  const int64_t expected = rows16 ? (N + 15) / 16 * (K / 256) * tandem_gguf_vnni::rows16::group_bytes(qtype)
                                  : (N + 7) / 8 * (K / 256) * tandem_gguf_avx2::rows8::group_bytes(qtype);
  TORCH_CHECK(expected > 0 && packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.numel() == expected,
              "gguf linear: a packed weight must be pack()'s output for this weight");
  return packed.data_ptr<uint8_t>();
}

// Asks the OS for 2 MB pages over [p, p + bytes), before it is first written: the tiles stream
// the weights in order, and the hardware's prefetchers stop at every 4 KB page.
inline void huge_pages(uint8_t* p, int64_t bytes) {
#ifdef MADV_HUGEPAGE
  constexpr uintptr_t kHuge = 2 << 20;
  const uintptr_t start = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (end > start) madvise(reinterpret_cast<void*>(start), end - start, MADV_HUGEPAGE);  // advice only: failure is harmless
#endif
}

// Q4_K / Q6_K rows [N, row_bytes] -> F's layout in groups of ``Rows`` rows (gguf_rows8_avx2.h's
// groups of 8, 2-D [groups][blocks x bytes], or gguf_rows16_vnni.h's of 16, 3-D [groups][blocks]
// [bytes]: the shape tells the layouts apart, their sizes can be equal).
template <class F, int Rows>
torch::Tensor pack_as(const torch::Tensor& raw, int64_t N, int64_t K) {
  TORCH_CHECK(K % 256 == 0 && raw.scalar_type() == at::kByte && raw.dim() == 2 && raw.size(0) == N &&
                  raw.size(1) == K / 256 * F::kFileBytes && raw.is_contiguous(),
              "gguf pack: raw weights must be contiguous uint8 [N, K / 256 * block bytes]");
  const int64_t groups = (N + Rows - 1) / Rows, blocks = K / 256;
  torch::Tensor out = Rows == 16 ? torch::empty({groups, blocks, F::kGroupBytes}, torch::kUInt8)
                                 : torch::empty({groups, blocks * F::kGroupBytes}, torch::kUInt8);
  TORCH_CHECK(reinterpret_cast<uintptr_t>(out.data_ptr<uint8_t>()) % 64 == 0, "gguf pack: the layout's vectors need 64-byte alignment");
  huge_pages(out.data_ptr<uint8_t>(), out.numel());
  const uint8_t* W = raw.data_ptr<uint8_t>();
  uint8_t* O = out.data_ptr<uint8_t>();
  at::parallel_for(0, groups, 128 / Rows, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      if constexpr (Rows == 16) tandem_gguf_vnni::rows16::pack_group<F>(W, raw.size(1), N, 16 * g, blocks, O + g * blocks * F::kGroupBytes);
      else tandem_gguf_avx2::rows8::pack_group<F>(W, raw.size(1), N, 8 * g, blocks, O + g * blocks * F::kGroupBytes);
    }
  });
  return out;
}

// The weight laid out again for the tiles in use: Q4_K and Q6_K in groups of 16 rows for the VNNI
// tiles (where no AMX tiles run), in groups of 8 for the AVX2 tiles; an empty tensor
// where the tiles read the file's rows.
torch::Tensor pack(torch::Tensor raw, int64_t qtype, int64_t N, int64_t K) {
  const bool vnni = use_vnni();
  if (packs_rows16(vnni) && qtype == Q4_K) return pack_as<tandem_gguf_vnni::rows16::Q4K, 16>(raw, N, K);
  if (packs_rows16(vnni) && qtype == Q6_K) return pack_as<tandem_gguf_vnni::rows16::Q6K, 16>(raw, N, K);
  if (vnni) return torch::empty({0}, torch::kUInt8);
  if (qtype == Q4_K) return pack_as<tandem_gguf_avx2::rows8::Q4K, 8>(raw, N, K);
  if (qtype == Q6_K) return pack_as<tandem_gguf_avx2::rows8::Q6K, 8>(raw, N, K);
  return torch::empty({0}, torch::kUInt8);
}

torch::Tensor linear(torch::Tensor x, torch::Tensor raw, torch::Tensor packed, int64_t qtype, int64_t N, int64_t K,
                     c10::optional<torch::Tensor> bias) {
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
  const uint8_t* P = packed_for(packed, vnni, qtype, N, K);
  const bool amx = use_amx(vnni, qtype, M);
  const bool prefill = use_prefill(vnni, qtype, M) || (vnni && P);  // rows16 runs in the prefill tiles' region
  quantize_inputs(xf.data_ptr<float>(), M, K, QB, in, vnni && !prefill && !amx && (qtype == Q4_K || qtype == Q5_K));
  bool done;
  if (amx) {
    const tandem_gguf_vnni::Job job{raw.data_ptr<uint8_t>(), raw.size(1), N, &in, B, out.data_ptr<float>(), N};
    done = tandem_gguf_amx::amx_group(&job, &qtype, 1, M);
  } else if (prefill) {
    const tandem_gguf_vnni::Job job{raw.data_ptr<uint8_t>(), raw.size(1), N, &in, B, out.data_ptr<float>(), N, P};
    done = tandem_gguf_vnni::prefill_group(&job, &qtype, 1, M);
  } else {
    done = vnni
        ? tandem_gguf_vnni::dispatch(qtype, tandem_gguf_vnni::Job{raw.data_ptr<uint8_t>(), raw.size(1), N, &in, B, out.data_ptr<float>(), N}, M)
        : tandem_gguf_avx2::dispatch(qtype, tandem_gguf_avx2::Job{raw.data_ptr<uint8_t>(), raw.size(1), N, &in, B, out.data_ptr<float>(), N, P}, M);
  }
  TORCH_CHECK(done, "gguf linear: unsupported type ", qtype);
  return out.to(x.scalar_type()).reshape(out_shape);
}

inline bool is_kquant(int64_t qtype) { return qtype == Q4_K || qtype == Q5_K || qtype == Q6_K; }

// The jobs of ``linear_group`` on one tile set, run in one parallel region.
template <class Job>
bool run_jobs(const std::vector<torch::Tensor>& raws, const std::vector<const uint8_t*>& packed, const std::vector<int64_t>& qtypes,
              const std::vector<int64_t>& ns, const std::vector<const float*>& biases, const std::vector<const Inputs*>& inputs,
              float* O, int64_t ldo, int64_t M, bool (*run)(const Job*, const int64_t*, int64_t, int64_t)) {
  std::vector<Job> jobs;
  int64_t column = 0;
  for (size_t j = 0; j < raws.size(); ++j) {
    jobs.push_back(Job{raws[j].data_ptr<uint8_t>(), raws[j].size(1), ns[j], inputs[j], biases[j], O + column, ldo, packed[j]});
    column += ns[j];
  }
  return run(jobs.data(), qtypes.data(), static_cast<int64_t>(jobs.size()), M);
}

// [x . W_0^T + b_0 | x . W_1^T + b_1 | ...]: several weights of width K on the same input,
// their outputs side by side in one [.., sum N] tensor, each bit for bit what ``linear`` gives.
// The input is quantized once per block layout and all the weights' tiles share one parallel
// region. biases: an empty tensor for none.
torch::Tensor linear_group(torch::Tensor x, std::vector<torch::Tensor> raws, std::vector<torch::Tensor> packs,
                           std::vector<int64_t> qtypes, std::vector<int64_t> ns, int64_t K, std::vector<torch::Tensor> biases) {
  const size_t count = raws.size();
  TORCH_CHECK(count >= 1 && count <= 8 && qtypes.size() == count && ns.size() == count && biases.size() == count &&
                  packs.size() == count,
              "gguf linear group: 1 to 8 weights, each with its type, rows, packed layout and bias");
  TORCH_CHECK(x.size(-1) == K, "gguf linear group: input width must be the weights'");
  int64_t total = 0;
  std::vector<torch::Tensor> bias_f(count);
  std::vector<const float*> B(count, nullptr);
  for (size_t j = 0; j < count; ++j) {
    TORCH_CHECK(K % (is_kquant(qtypes[j]) ? 256 : 32) == 0, "gguf linear group: input width must be a multiple of each block");
    TORCH_CHECK(raws[j].scalar_type() == at::kByte && raws[j].dim() == 2 && raws[j].size(0) == ns[j] && raws[j].is_contiguous(),
                "gguf linear group: raw weights must be contiguous uint8 [N, row_bytes]");
    if (biases[j].defined() && biases[j].numel() > 0) {
      bias_f[j] = biases[j].to(at::kFloat).contiguous();
      TORCH_CHECK(bias_f[j].numel() == ns[j], "gguf linear group: a bias must have its weight's N values");
      B[j] = bias_f[j].data_ptr<float>();
    }
    total += ns[j];
  }
  auto out_shape = x.sizes().vec();
  out_shape.back() = total;
  auto xf = x.reshape({-1, K}).to(at::kFloat).contiguous();
  const int64_t M = xf.size(0);
  auto out = torch::empty({M, total}, xf.options());
  if (M == 0 || total == 0) return out.to(x.scalar_type()).reshape(out_shape);
  const bool vnni = use_vnni();
  std::vector<const uint8_t*> packed(count, nullptr);  // the layout made at load for the tiles in use, where one was
  for (size_t j = 0; j < count; ++j) packed[j] = packed_for(packs[j], vnni, qtypes[j], ns[j], K);
  // Any weight on the prefill (AMX) tiles, or packed in rows of 16: then all of them run in their region.
  bool prefill = false, amx = false;
  for (size_t j = 0; j < count; ++j) {
    prefill = prefill || use_prefill(vnni, qtypes[j], M) || (vnni && packed[j]);
    amx = amx || use_amx(vnni, qtypes[j], M);
  }
  // The input layouts the weights read: per 256 values (interleaved for VNNI Q4_K / Q5_K on the
  // tiles of 8: a Q4_K from its file against fewer than kPrefillRows rows) or 32.
  Inputs layouts[3];
  bool made[3] = {false, false, false};
  std::vector<const Inputs*> inputs(count);
  for (size_t j = 0; j < count; ++j) {
    const bool q4k_on_tiles_of_8 = qtypes[j] == Q4_K && !packed[j] && !amx && M < tandem_gguf_vnni::kPrefillRows;
    const bool interleave = vnni && (qtypes[j] == Q5_K || q4k_on_tiles_of_8 || (qtypes[j] == Q4_K && !prefill && !amx));
    const int which = is_kquant(qtypes[j]) ? (interleave ? 0 : 1) : 2;
    if (!made[which]) {
      quantize_inputs(xf.data_ptr<float>(), M, K, which == 2 ? 32 : 256, layouts[which], interleave);
      made[which] = true;
    }
    inputs[j] = &layouts[which];
  }
  const bool done = amx
      ? run_jobs<tandem_gguf_vnni::Job>(raws, packed, qtypes, ns, B, inputs, out.data_ptr<float>(), total, M, tandem_gguf_amx::amx_group)
      : prefill
      ? run_jobs<tandem_gguf_vnni::Job>(raws, packed, qtypes, ns, B, inputs, out.data_ptr<float>(), total, M, tandem_gguf_vnni::prefill_group)
      : vnni
      ? run_jobs<tandem_gguf_vnni::Job>(raws, packed, qtypes, ns, B, inputs, out.data_ptr<float>(), total, M, tandem_gguf_vnni::run_group)
      : run_jobs<tandem_gguf_avx2::Job>(raws, packed, qtypes, ns, B, inputs, out.data_ptr<float>(), total, M, tandem_gguf_avx2::run_group);
  TORCH_CHECK(done, "gguf linear group: a type these tiles do not cover");
  return out.to(x.scalar_type()).reshape(out_shape);
}

}  // namespace tandem_gguf

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // Release the GIL while computing: the Qt window's thread must keep running during a step.
  m.def("linear", &tandem_gguf::linear, "GGUF-block linear, inputs quantized to int8 per block",
        py::call_guard<py::gil_scoped_release>());
  m.def("linear_group", &tandem_gguf::linear_group,
        "several GGUF-block linears on one input, outputs side by side, in one parallel region",
        py::call_guard<py::gil_scoped_release>());
  m.def("pack", &tandem_gguf::pack, "Q4_K / Q6_K rows laid out in groups of 8 for the AVX2 tiles (empty for other types)",
        py::call_guard<py::gil_scoped_release>());
  m.def("gguf_allow_packed", [](bool on) { tandem_gguf::packed_enabled() = on; },
        "let the AVX2 tiles compute from the packed layouts they are given (tests compare with the file's layout)");
  m.def("gguf_isa", []() { return std::string(tandem_gguf::isa_name()); },
        "which tiles run: amx_int8 (Q4_K / Q6_K against many rows; the rest avx512_vnni), avx512_vnni or avx2");
  m.def("gguf_allow_vnni", [](bool on) { tandem_gguf::vnni_enabled() = on; },
        "allow the AVX-512 VNNI tiles where the CPU has them (tests compare both on one machine)");
  m.def("gguf_allow_prefill", [](bool on) { tandem_gguf::prefill_enabled() = on; },
        "allow the VNNI tiles of 16 weight rows for many input rows (tests compare their bits)");
  m.def("gguf_allow_amx", [](bool on) { tandem_gguf::amx_enabled() = on; },
        "allow the AMX-INT8 tiles where the CPU and the OS have them (tests compare their bits)");
  m.def("gguf_amx_rows", [](int64_t rows) {
        const int64_t was = tandem_gguf::amx_rows();
        if (rows > 0) tandem_gguf::amx_rows() = rows;
        return was;
      },
        "set the input rows from which Q4_K / Q6_K take the AMX tiles (0: leave it); returns the previous value");
}
