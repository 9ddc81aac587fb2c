// int8-weight linear on raw fp32 buffers, shared by the extensions that need it
// (kernels/quant_linear, kernels/draft_decoder). See quant_linear_avx2.cpp for the contract.
#pragma once
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "avx2_common.h"

namespace tandem_int8 {

using tandem_avx2::hsum;

inline __m256 load_i8x8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// NR weight rows x MR input rows. Every widened weight vector is reused MR times; NR*MR
// independent accumulators hide the FMA latency. Registers: NR widened weight vectors + NR*MR
// accumulators + one input vector, which meets every weight row once loaded (reading it once
// per weight row instead made verification bound by activation reads from L2, as in
// kernels/linear). PREFETCH fetches the next tile's weight rows ahead: one input row (drafting,
// decoding) and verification's few rows stream the weights, and the hardware prefetcher does
// not ramp up within one short row (896 bytes for a 0.5B model).
template <int NR, int MR, bool PREFETCH = (MR == 1)>
inline void tile(const float* X, const int8_t* W, const float* S, const float* B, float* O,
                 int64_t m, int64_t n, int64_t n_end, int64_t K, int64_t N) {
  __m256 acc[NR][MR];
  for (int i = 0; i < NR; ++i)
    for (int j = 0; j < MR; ++j) acc[i][j] = _mm256_setzero_ps();
  const bool prefetch = PREFETCH && n + 2 * NR <= n_end;
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    // The next tile's NR rows are NR*K contiguous bytes: fetch them as one run, a line each time
    // this tile's reads cross one. Fetching each row's next line every 64 k (8 short runs at
    // once) read 1536-wide rows at ~10 GB/s, one run at ~14 GB/s (one row 1.50 -> 1.00 ms).
    if (prefetch && ((k * NR) & 63) < NR * 8) {
      _mm_prefetch(reinterpret_cast<const char*>(W + (n + NR) * K + k * NR), _MM_HINT_T0);
    }
    if constexpr (MR == 1) {  // 8 rows wide: widen each weight vector just before its FMA
      for (int i = 0; i < NR; ++i)
        acc[i][0] = _mm256_fmadd_ps(_mm256_loadu_ps(X + m * K + k), load_i8x8(W + (n + i) * K + k), acc[i][0]);
    } else {
      __m256 wv[NR];
      for (int i = 0; i < NR; ++i) wv[i] = load_i8x8(W + (n + i) * K + k);
      for (int j = 0; j < MR; ++j) {
        const __m256 xv = _mm256_loadu_ps(X + (m + j) * K + k);
        for (int i = 0; i < NR; ++i) acc[i][j] = _mm256_fmadd_ps(xv, wv[i], acc[i][j]);
      }
    }
  }
  for (int i = 0; i < NR; ++i) {
    const int8_t* wr = W + (n + i) * K;
    for (int j = 0; j < MR; ++j) {
      const float* xr = X + (m + j) * K;
      float s = hsum(acc[i][j]);
      for (int64_t kk = k; kk < K; ++kk) s += xr[kk] * static_cast<float>(wr[kk]);
      O[(m + j) * N + n + i] = s * S[n + i] + (B ? B[n + i] : 0.0f);
    }
  }
}

template <int NR, int MR, bool PREFETCH = (MR == 1)>
inline void rows(const float* X, const int8_t* W, const float* S, const float* B, float* O,
                 int64_t m, int64_t n0, int64_t n1, int64_t K, int64_t N) {
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) tile<NR, MR, PREFETCH>(X, W, S, B, O, m, n, n1, K, N);
  for (; n < n1; ++n) tile<1, MR, false>(X, W, S, B, O, m, n, n1, K, N);
}

// Input rows in chunks of MR1, MRS... rows against the same NR weight rows, one chunk after the
// other: no tile of 7 or more rows fits the registers, and later chunks find the weights in L1
// (only the first prefetches).
template <int NR, int MR1, int... MRS>
inline void split_rows(const float* X, const int8_t* W, const float* S, const float* B, float* O,
                       int64_t n0, int64_t n1, int64_t K, int64_t N) {
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) {
    tile<NR, MR1, true>(X, W, S, B, O, 0, n, n1, K, N);
    int64_t m = MR1;
    ((tile<NR, MRS, false>(X, W, S, B, O, m, n, n1, K, N), m += MRS), ...);
  }
  for (; n < n1; ++n) {
    tile<1, MR1, false>(X, W, S, B, O, 0, n, n1, K, N);
    int64_t m = MR1;
    ((tile<1, MRS, false>(X, W, S, B, O, m, n, n1, K, N), m += MRS), ...);
  }
}

// O[M, N] = (X[M, K] . W[N, K]^T) * S[N] + B[N], parallel over N.
inline void linear_into(const float* X, int64_t M, int64_t K, const int8_t* W, const float* S,
                        const float* B, int64_t N, float* O) {
  // Split across threads only when each gets enough weights to amortize waking it (~32 KB).
  const int64_t grain = std::max<int64_t>(64, (32 << 10) / std::max<int64_t>(K, 1));
  if (M <= 9) {  // decoding and verification (a draft of up to 8 tokens plus one): stream the
                 // weights once, prefetching ahead. Shapes as in kernels/linear (measured there).
    at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
      switch (M) {
        case 1: rows<8, 1>(X, W, S, B, O, 0, n0, n1, K, N); break;
        case 2: rows<4, 2, true>(X, W, S, B, O, 0, n0, n1, K, N); break;
        case 3: rows<3, 3, true>(X, W, S, B, O, 0, n0, n1, K, N); break;
        case 4: rows<3, 4, true>(X, W, S, B, O, 0, n0, n1, K, N); break;
        case 5: rows<2, 5, true>(X, W, S, B, O, 0, n0, n1, K, N); break;
        case 6: rows<2, 6, true>(X, W, S, B, O, 0, n0, n1, K, N); break;
        case 7: split_rows<3, 4, 3>(X, W, S, B, O, n0, n1, K, N); break;
        case 8: split_rows<3, 4, 4>(X, W, S, B, O, n0, n1, K, N); break;
        default: split_rows<3, 3, 3, 3>(X, W, S, B, O, n0, n1, K, N); break;
      }
    });
    return;
  }
  constexpr int64_t kBlock = 16;  // weight rows kept in L1/L2 while all input rows use them
  at::parallel_for(0, N, grain, [&](int64_t n_begin, int64_t n_end) {
    for (int64_t n0 = n_begin; n0 < n_end; n0 += kBlock) {
      const int64_t n1 = std::min(n0 + kBlock, n_end);
      int64_t m = 0;
      for (; m + 6 <= M; m += 6) rows<2, 6>(X, W, S, B, O, m, n0, n1, K, N);
      switch (M - m) {
        case 5: rows<2, 5>(X, W, S, B, O, m, n0, n1, K, N); break;
        case 4: rows<2, 4>(X, W, S, B, O, m, n0, n1, K, N); break;
        case 3: rows<3, 3>(X, W, S, B, O, m, n0, n1, K, N); break;
        case 2: rows<4, 2>(X, W, S, B, O, m, n0, n1, K, N); break;
        case 1: rows<8, 1>(X, W, S, B, O, m, n0, n1, K, N); break;
        default: break;
      }
    }
  });
}

// Packed layout for drafters: [N/8][K][8] int8, panel p holding output rows 8p..8p+7
// interleaved by k (kernels/linear/packing.py). One 8-byte load gives the weights of 8 outputs
// at one k and each input row broadcasts x[k]: no horizontal sums, one contiguous stream per
// panel. Drafting (one row) reads the weights at ~1.3x the speed of the row layout here.
template <int NP, int MR>
inline void ptile(const float* X, const int8_t* Wp, const float* S, const float* B, float* O,
                  int64_t m, int64_t p, int64_t K, int64_t N) {
  __m256 acc[NP][MR];
  for (int i = 0; i < NP; ++i)
    for (int j = 0; j < MR; ++j) acc[i][j] = _mm256_setzero_ps();
  const int8_t* w = Wp + p * K * 8;
  for (int64_t k = 0; k < K; ++k) {
    // One input row (drafting): fetch the next tile's NP panels (contiguous) as one run, a line
    // each time this tile's reads cross one. Pays on short panels (0.5B gate/up, K = 896:
    // 0.38 -> 0.32 ms); on long ones (K = 4864) it fetched too far ahead and lost ~15%.
    if constexpr (MR == 1) {
      if (K <= 2048 && ((k * NP * 8) & 63) < NP * 8)
        _mm_prefetch(reinterpret_cast<const char*>(w + NP * K * 8 + k * NP * 8), _MM_HINT_T0);
    }
    __m256 wv[NP];
    for (int i = 0; i < NP; ++i) wv[i] = load_i8x8(w + (i * K + k) * 8);
    for (int j = 0; j < MR; ++j) {
      const __m256 xb = _mm256_broadcast_ss(X + (m + j) * K + k);
      for (int i = 0; i < NP; ++i) acc[i][j] = _mm256_fmadd_ps(xb, wv[i], acc[i][j]);
    }
  }
  for (int i = 0; i < NP; ++i) {
    const __m256 sc = _mm256_loadu_ps(S + (p + i) * 8);
    const __m256 b = B ? _mm256_loadu_ps(B + (p + i) * 8) : _mm256_setzero_ps();
    for (int j = 0; j < MR; ++j)
      _mm256_storeu_ps(O + (m + j) * N + (p + i) * 8, _mm256_fmadd_ps(acc[i][j], sc, b));
  }
}

template <int NP, int MR>
inline void panels(const float* X, const int8_t* Wp, const float* S, const float* B, float* O,
                   int64_t m, int64_t p0, int64_t p1, int64_t K, int64_t N) {
  int64_t p = p0;
  for (; p + NP <= p1; p += NP) ptile<NP, MR>(X, Wp, S, B, O, m, p, K, N);
  for (; p < p1; ++p) ptile<1, MR>(X, Wp, S, B, O, m, p, K, N);
}

// Panel [K][8] -> 8 rows [8][K], 8x8 bytes at a time (three rounds of unpacks).
inline void unpack_panel(const int8_t* src, int64_t K, int8_t* dst) {
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    const int8_t* s8 = src + k * 8;
    __m128i x[8];
    for (int i = 0; i < 8; ++i) x[i] = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s8 + i * 8));
    const __m128i t0 = _mm_unpacklo_epi8(x[0], x[1]), t1 = _mm_unpacklo_epi8(x[2], x[3]);
    const __m128i t2 = _mm_unpacklo_epi8(x[4], x[5]), t3 = _mm_unpacklo_epi8(x[6], x[7]);
    const __m128i u0 = _mm_unpacklo_epi16(t0, t1), u1 = _mm_unpackhi_epi16(t0, t1);
    const __m128i u2 = _mm_unpacklo_epi16(t2, t3), u3 = _mm_unpackhi_epi16(t2, t3);
    const __m128i v[4] = {_mm_unpacklo_epi32(u0, u2), _mm_unpackhi_epi32(u0, u2),
                          _mm_unpacklo_epi32(u1, u3), _mm_unpackhi_epi32(u1, u3)};
    for (int i = 0; i < 4; ++i) {
      _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + (2 * i) * K + k), v[i]);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + (2 * i + 1) * K + k), _mm_srli_si128(v[i], 8));
    }
  }
  for (; k < K; ++k)
    for (int r = 0; r < 8; ++r) dst[r * K + k] = src[k * 8 + r];
}

// The same as linear_into on packed weights Wp [N/8][K][8] (N a multiple of 8).
inline void linear_into_packed(const float* X, int64_t M, int64_t K, const int8_t* Wp, const float* S,
                               const float* B, int64_t N, float* O) {
  const int64_t P = N / 8;
  const int64_t grain = std::max<int64_t>(2, (32 << 10) / std::max<int64_t>(8 * K, 1));
  at::parallel_for(0, P, grain, [&](int64_t p_begin, int64_t p_end) {
    if (M == 1) {
      panels<4, 1>(X, Wp, S, B, O, 0, p_begin, p_end, K, N);
      return;
    }
    if (M <= 7) {  // a few rows (a drafter catching up): each panel is read once
      switch (M) {
        case 7: panels<1, 7>(X, Wp, S, B, O, 0, p_begin, p_end, K, N); break;
        case 6: panels<2, 6>(X, Wp, S, B, O, 0, p_begin, p_end, K, N); break;
        case 5: panels<2, 5>(X, Wp, S, B, O, 0, p_begin, p_end, K, N); break;
        case 4: panels<3, 4>(X, Wp, S, B, O, 0, p_begin, p_end, K, N); break;
        case 3: panels<3, 3>(X, Wp, S, B, O, 0, p_begin, p_end, K, N); break;
        default: panels<3, 2>(X, Wp, S, B, O, 0, p_begin, p_end, K, N); break;
      }
      return;
    }
    // Many rows (a prompt's prefill) are bound by arithmetic, where the row layout's tiles do
    // better: unpack 16 weight rows at a time into a small buffer (cheap next to M passes over
    // them) and run those tiles on it.
    std::vector<int8_t> block(16 * K);
    for (int64_t p0 = p_begin; p0 < p_end; p0 += 2) {
      const int64_t p1 = std::min(p0 + 2, p_end), n0 = p0 * 8, n_rows = (p1 - p0) * 8;
      for (int64_t p = p0; p < p1; ++p) unpack_panel(Wp + p * K * 8, K, block.data() + (p - p0) * 8 * K);
      const float* Bn = B ? B + n0 : nullptr;
      int64_t m = 0;
      for (; m + 6 <= M; m += 6) rows<2, 6>(X, block.data(), S + n0, Bn, O + n0, m, 0, n_rows, K, N);
      switch (M - m) {
        case 5: rows<2, 5>(X, block.data(), S + n0, Bn, O + n0, m, 0, n_rows, K, N); break;
        case 4: rows<2, 4>(X, block.data(), S + n0, Bn, O + n0, m, 0, n_rows, K, N); break;
        case 3: rows<3, 3>(X, block.data(), S + n0, Bn, O + n0, m, 0, n_rows, K, N); break;
        case 2: rows<4, 2>(X, block.data(), S + n0, Bn, O + n0, m, 0, n_rows, K, N); break;
        case 1: rows<4, 1>(X, block.data(), S + n0, Bn, O + n0, m, 0, n_rows, K, N); break;
        default: break;
      }
    }
  });
}

// Checks an int8 weight tensor, [N, K] or packed [N/8, K, 8], against its scale [N] and the
// input width K; returns N.
inline int64_t check_weight(const torch::Tensor& q, const torch::Tensor& scale, int64_t K) {
  TORCH_CHECK(q.scalar_type() == at::kChar && q.is_contiguous(), "int8 weight must be contiguous");
  TORCH_CHECK((q.dim() == 2 && q.size(1) == K) || (q.dim() == 3 && q.size(1) == K && q.size(2) == 8),
              "int8 weight must be [N, K] or packed [N/8, K, 8]");
  const int64_t N = q.dim() == 2 ? q.size(0) : q.size(0) * 8;
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.numel() == N && scale.is_contiguous(), "scale must be [N] fp32");
  return N;
}

// Either layout.
inline void linear_into_any(const float* X, int64_t M, int64_t K, const torch::Tensor& q, const float* S,
                            const float* B, int64_t N, float* O) {
  if (q.dim() == 3)
    linear_into_packed(X, M, K, q.data_ptr<int8_t>(), S, B, N, O);
  else
    linear_into(X, M, K, q.data_ptr<int8_t>(), S, B, N, O);
}

}  // namespace tandem_int8
