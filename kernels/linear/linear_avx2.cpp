// y[m, n] = sum_k x[m, k] * w[n, k] (+ b[n]) with w in bf16, accumulated in fp32.
// Each weight row is read once from memory and widened to fp32 in registers, then applied to
// every input row, so for small M the cost is one pass over the weights. Every output element is
// computed by the same instruction sequence whatever M is (batch invariance).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cstdint>
#include <cstring>
#include <algorithm>

#include "avx2_common.h"

namespace {

using tandem_avx2::bf16_to_float;
using tandem_avx2::hsum;
using tandem_avx2::load_bf16x8;

// A tile of NR weight rows x MR input rows: NR*MR independent accumulators hide the FMA latency
// and every widened weight vector is reused MR times. Each output element still has exactly one
// accumulator summed in k order and reduced by hsum, so its value does not depend on the tile
// shape, hence not on M.
//
// Registers: NR widened weight vectors + NR*MR accumulators + one input vector (<= 16). Holding
// the input vector while it meets every weight row reads each input row once per tile rather
// than once per weight row: with 6 rows of K = 1536 the inputs spill out of L1, and those reads
// (not the FMAs, not the weights) were what made 6 rows cost 2x one row.
//
// PREFETCH fetches the next tile's weight rows ahead: one input row (plain decoding, drafting)
// and verification's few rows are bound by streaming the weights from memory, and the hardware
// prefetcher barely ramps up within a short row.
template <int NR, int MR, bool PREFETCH>
inline void tile(const float* X, const uint16_t* W, const float* B, float* O, int64_t m, int64_t n, int64_t n_end, int64_t K, int64_t N) {
  __m256 acc[NR][MR];
  for (int i = 0; i < NR; ++i)
    for (int j = 0; j < MR; ++j) acc[i][j] = _mm256_setzero_ps();
  const bool prefetch = PREFETCH && n + 2 * NR <= n_end;
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    // The next tile's NR rows are 2*NR*K contiguous bytes: fetch them as one run, a line each
    // time this tile's reads cross one (as kernels/quant_linear; one run beat NR short ones).
    if (prefetch && ((k * 2 * NR) & 63) < NR * 16) {
      _mm_prefetch(reinterpret_cast<const char*>(W + (n + NR) * K) + k * 2 * NR, _MM_HINT_T0);
    }
    __m256 wv[NR];
    for (int i = 0; i < NR; ++i) wv[i] = load_bf16x8(W + (n + i) * K + k);
    for (int j = 0; j < MR; ++j) {
      const __m256 xv = _mm256_loadu_ps(X + (m + j) * K + k);
      for (int i = 0; i < NR; ++i) acc[i][j] = _mm256_fmadd_ps(xv, wv[i], acc[i][j]);
    }
  }
  for (int i = 0; i < NR; ++i) {
    const uint16_t* wr = W + (n + i) * K;
    for (int j = 0; j < MR; ++j) {
      const float* xr = X + (m + j) * K;
      float s = hsum(acc[i][j]);
      for (int64_t kk = k; kk < K; ++kk) s += xr[kk] * bf16_to_float(wr[kk]);
      O[(m + j) * N + n + i] = s + (B ? B[n + i] : 0.0f);
    }
  }
}

template <int NR, int MR, bool PREFETCH = false>
inline void rows(const float* X, const uint16_t* W, const float* B, float* O, int64_t m, int64_t n0, int64_t n1, int64_t K, int64_t N) {
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) tile<NR, MR, PREFETCH>(X, W, B, O, m, n, n1, K, N);
  for (; n < n1; ++n) tile<1, MR, false>(X, W, B, O, m, n, n1, K, N);
}

// Input rows in chunks of MR1, MRS... rows against the same NR weight rows, one chunk after the
// other: no tile of 7 or more rows fits the registers, and later chunks find the weights in L1
// (only the first prefetches).
template <int NR, int MR1, int... MRS>
inline void split_rows(const float* X, const uint16_t* W, const float* B, float* O, int64_t n0, int64_t n1, int64_t K, int64_t N) {
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) {
    tile<NR, MR1, true>(X, W, B, O, 0, n, n1, K, N);
    int64_t m = MR1;
    ((tile<NR, MRS, false>(X, W, B, O, m, n, n1, K, N), m += MRS), ...);
  }
  for (; n < n1; ++n) {
    tile<1, MR1, false>(X, W, B, O, 0, n, n1, K, N);
    int64_t m = MR1;
    ((tile<1, MRS, false>(X, W, B, O, m, n, n1, K, N), m += MRS), ...);
  }
}

}  // namespace

torch::Tensor linear_bf16w(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.dim() == 2 && w.is_contiguous(), "weight must be contiguous [N, K] bf16");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(x.size(-1) == K, "x last dim must equal K");
  auto out_shape = x.sizes().vec();
  out_shape.back() = N;
  auto xf = x.reshape({-1, K}).to(at::kFloat).contiguous();
  const int64_t M = xf.size(0);
  auto out = torch::empty({M, N}, xf.options());
  const float* X = xf.data_ptr<float>();
  const uint16_t* W = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  float* O = out.data_ptr<float>();
  torch::Tensor bf;
  const float* B = nullptr;
  if (bias.has_value() && bias->defined()) {
    bf = bias->to(at::kFloat).contiguous();
    B = bf.data_ptr<float>();
  }
  constexpr int64_t kBlock = 16;  // weight rows kept in L1/L2 while all input rows use them
  at::parallel_for(0, N, 64, [&](int64_t n_begin, int64_t n_end) {
    // Decoding (1 row) and verification (2..9 rows: a draft of up to 8 tokens plus one) stream
    // the weights once, prefetching ahead. Tile shapes measured on Zen 3 (2 threads, 8 distinct
    // 1536x8960 weights so memory is real): 3 weight rows x 4 input rows beat 2 x 4 by ~8% at
    // 8 rows; 9 rows in the prefill tiles below cost 2.2x one row, in chunks of 3 rows 1.6x.
    switch (M) {
      case 1: rows<4, 1, true>(X, W, B, O, 0, n_begin, n_end, K, N); return;
      case 2: rows<4, 2, true>(X, W, B, O, 0, n_begin, n_end, K, N); return;
      case 3: rows<3, 3, true>(X, W, B, O, 0, n_begin, n_end, K, N); return;
      case 4: rows<3, 4, true>(X, W, B, O, 0, n_begin, n_end, K, N); return;
      case 5: rows<2, 5, true>(X, W, B, O, 0, n_begin, n_end, K, N); return;
      case 6: rows<2, 6, true>(X, W, B, O, 0, n_begin, n_end, K, N); return;
      case 7: split_rows<3, 4, 3>(X, W, B, O, n_begin, n_end, K, N); return;
      case 8: split_rows<3, 4, 4>(X, W, B, O, n_begin, n_end, K, N); return;
      case 9: split_rows<3, 3, 3, 3>(X, W, B, O, n_begin, n_end, K, N); return;
      default: break;
    }
    // Prefill: blocks of weight rows stay in cache while every input row passes over them.
    for (int64_t n0 = n_begin; n0 < n_end; n0 += kBlock) {
      const int64_t n1 = std::min(n0 + kBlock, n_end);
      int64_t m = 0;
      for (; M - m > 7; m += 6) rows<2, 6>(X, W, B, O, m, n0, n1, K, N);
      switch (M - m) {
        case 7: rows<2, 4>(X, W, B, O, m, n0, n1, K, N); rows<2, 3>(X, W, B, O, m + 4, n0, n1, K, N); break;
        case 6: rows<2, 6>(X, W, B, O, m, n0, n1, K, N); break;
        case 5: rows<2, 5>(X, W, B, O, m, n0, n1, K, N); break;
        case 4: rows<2, 4>(X, W, B, O, m, n0, n1, K, N); break;
        case 3: rows<3, 3>(X, W, B, O, m, n0, n1, K, N); break;
        case 2: rows<4, 2>(X, W, B, O, m, n0, n1, K, N); break;
        case 1: rows<4, 1>(X, W, B, O, m, n0, n1, K, N); break;
        default: break;
      }
    }
  });
  return out.to(x.scalar_type()).reshape(out_shape);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // Release the GIL while computing: the Qt window's thread must keep running during a step.
  m.def("linear_bf16w", &linear_bf16w, "bf16-weight linear, fp32 accumulation, batch-invariant",
        py::call_guard<py::gil_scoped_release>());
}
