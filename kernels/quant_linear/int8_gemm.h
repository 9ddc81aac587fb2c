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
#include "fp32_tiles.h"

namespace tandem_int8 {

using tandem_avx2::load_i8x8;
using tandem_fp32::Int8;
using tandem_fp32::Tiles;

// O[M, N] = (X[M, K] . W[N, K]^T) * S[N] + B[N], parallel over N (the tiles: fp32_tiles.h).
inline void linear_into(const float* X, int64_t M, int64_t K, const int8_t* W, const float* S,
                        const float* B, int64_t N, float* O) {
  // Split across threads only when each gets enough weights to amortize waking it (~32 KB).
  tandem_fp32::linear_into(Tiles<Int8>{X, W, S, B, O, K, N}, M, tandem_tiles::grain(K, 64));
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
  const int64_t grain = tandem_tiles::grain(8 * K, 2);
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
      const Tiles<tandem_fp32::Int8Unpacked> unpacked{X, block.data(), S + n0, B ? B + n0 : nullptr, O + n0, K, N};
      tandem_fp32::many_rows(unpacked, M, 0, n_rows);
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
