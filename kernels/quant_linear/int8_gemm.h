// int8-weight linear on raw fp32 buffers, shared by the extensions that need it
// (kernels/quant_linear, kernels/draft_decoder). See quant_linear_avx2.cpp for the contract.
#pragma once
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>

namespace tandem_int8 {

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

inline __m256 load_i8x8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// NR weight rows x MR input rows. Every widened weight vector is reused MR times; NR*MR
// independent accumulators hide the FMA latency. Activations are read from memory (L1) so that
// wide tiles fit in the 16 vector registers. With one input row (drafting) the next tile's
// weight rows are prefetched: the rows are short (896 bytes for a 0.5B model) and the hardware
// prefetcher does not ramp up within one.
template <int NR, int MR>
inline void tile(const float* X, const int8_t* W, const float* S, const float* B, float* O,
                 int64_t m, int64_t n, int64_t n_end, int64_t K, int64_t N) {
  __m256 acc[NR][MR];
  for (int i = 0; i < NR; ++i)
    for (int j = 0; j < MR; ++j) acc[i][j] = _mm256_setzero_ps();
  const bool prefetch = MR == 1 && n + 2 * NR <= n_end;
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    if (prefetch && (k & 63) == 0) {
      for (int i = 0; i < NR; ++i) _mm_prefetch(reinterpret_cast<const char*>(W + (n + NR + i) * K + k), _MM_HINT_T0);
    }
    for (int i = 0; i < NR; ++i) {
      const __m256 wv = load_i8x8(W + (n + i) * K + k);
      for (int j = 0; j < MR; ++j)
        acc[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(X + (m + j) * K + k), wv, acc[i][j]);
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

template <int NR, int MR>
inline void rows(const float* X, const int8_t* W, const float* S, const float* B, float* O,
                 int64_t m, int64_t n0, int64_t n1, int64_t K, int64_t N) {
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) tile<NR, MR>(X, W, S, B, O, m, n, n1, K, N);
  for (; n < n1; ++n) tile<1, MR>(X, W, S, B, O, m, n, n1, K, N);
}




// O[M, N] = (X[M, K] . W[N, K]^T) * S[N] + B[N], parallel over N.
inline void linear_into(const float* X, int64_t M, int64_t K, const int8_t* W, const float* S,
                        const float* B, int64_t N, float* O) {
  // Split across threads only when each gets enough weights to amortize waking it (~32 KB).
  const int64_t grain = std::max<int64_t>(64, (32 << 10) / std::max<int64_t>(K, 1));
  if (M == 1) {
    at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) { rows<8, 1>(X, W, S, B, O, 0, n0, n1, K, N); });
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

}  // namespace tandem_int8
