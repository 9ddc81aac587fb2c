// int8 weights x int16-quantized inputs, for int8 targets (see reference.py, linear_a16).
//
// Why: an int8 target's verification of a few rows was bound by arithmetic, not memory. With
// fp32 inputs every weight is widened to fp32 (two instructions per 8) and then needs one FMA
// per 8 weights per row. Quantizing the inputs to int16 (one scale per kBlock values, error
// below half of 1/32767 of the block's largest input, far below the weight's own rounding)
// lets vpmaddwd multiply 16 weights by 16 inputs in one instruction with exact integer sums,
// and a weight widens to int16 in one. One 1536 -> 8960 layer from memory, 2 threads: 4 rows
// 1.34 -> 1.05 ms, 5 rows 1.66 -> 1.28, 9 rows 2.62 -> 2.12; one row 0.95 -> 0.89.
//
// Batch invariance: a row's inputs are quantized on their own, its integer sums within a block
// are exact whatever the order, and the fp32 sums over blocks run in the same order (per lane,
// then one fixed horizontal sum) in every tile shape. So a row's result does not depend on how
// many rows are computed with it, as kernels/quant_linear promises.
#pragma once
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "avx2_common.h"
#include "int16_blocks.h"
#include "int16_inputs_vnni.h"
#include "tile_grid.h"

namespace tandem_a16 {

using tandem_int16::blocks;
using tandem_int16::kBlock;  // inputs per scale (256)

// Whether the AVX-512 VNNI tiles (int16_inputs_vnni.h) run where the CPU has them and K is a
// multiple of their step. On unless the environment says TANDEM_AVX512=0 (to measure the AVX2
// tiles on the same machine); tests switch it per module. A process keeps one setting while it
// decodes, so plain decoding and verification agree.
inline bool& vnni_enabled() {
  static bool on = tandem_avx2::avx512_allowed_by_env();
  return on;
}

inline bool cpu_has_vnni() { return tandem_avx2::cpu_has_avx512_vnni(); }

inline bool use_vnni(int64_t K) { return vnni_enabled() && cpu_has_vnni() && K % tandem_a16_vnni::kStep == 0; }

// "avx512_vnni" or "avx2": the tiles widths that are a multiple of 32 run (for reports, tests).
inline const char* tile_set() { return tandem_avx2::tile_set_name(vnni_enabled()); }

// X [M, K] fp32 -> Q [M, K] int16 and S [M, blocks(K)]: per block s = amax / 32767,
// q = round_half_even(x * (32767 / amax)) (0 where the block is all zeros).
inline void quantize_rows(const float* X, int64_t M, int64_t K, int16_t* Q, float* S) {
  const int64_t nb = blocks(K);
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t m = 0; m < M; ++m) {
    const float* x = X + m * K;
    int16_t* q = Q + m * K;
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t k0 = b * kBlock, k1 = std::min(K, k0 + kBlock);
      __m256 mx = _mm256_setzero_ps();
      int64_t k = k0;
      for (; k + 8 <= k1; k += 8) mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(x + k), absmask));
      float amax = tandem_avx2::hmax(mx);
      for (; k < k1; ++k) amax = std::max(amax, std::fabs(x[k]));
      S[m * nb + b] = amax / 32767.0f;
      const float inv = amax > 0 ? 32767.0f / amax : 0.0f;
      const __m256 vinv = _mm256_set1_ps(inv);
      k = k0;
      for (; k + 16 <= k1; k += 16) {  // the default rounding mode: to nearest, ties to even
        const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k), vinv));
        const __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8), vinv));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k),
                            _mm256_permute4x64_epi64(_mm256_packs_epi32(a, c), 0xD8));
      }
      for (; k < k1; ++k) q[k] = static_cast<int16_t>(std::nearbyint(x[k] * inv));
    }
  }
}

// NR weight rows x MR input rows. Registers: NR*MR int32 sums + NR widened weight vectors + one
// product (the inputs are read from L1 as memory operands), so NR*MR + NR <= 15. The fp32 sums
// over blocks stay in memory (L1; int16_blocks.h).
// may_prefetch: a bool, or std::true_type / std::false_type for a tile compiled for that value
// alone. Measured on one 1536 -> 8960 layer, 1 thread (Zen 4): 1..5 rows ran ~5% faster with
// one tile for both values, split_rows' 6..9 rows ~5% faster with one tile for each.
template <int NR, int MR, typename P>
inline void tile(const int16_t* X, const float* XS, const int8_t* W, const float* S, const float* B, float* O,
                 int64_t m, int64_t n, int64_t n_end, int64_t K, int64_t N, P may_prefetch) {
  TANDEM_INT16_TILE_STATE(256)
  const bool prefetch = may_prefetch && n + 2 * NR <= n_end;
  // One loop over k, blocks flushed inside it, the flush a macro (int16_blocks.h), no code
  // after the loop: with the blocks as a loop of their own, a lambda, or a tail loop after it,
  // GCC kept the int32 sums in memory (2x slower).
  for (int64_t k = 0; k < K; k += 16) {  // K % 16 == 0 (linear_into)
    // The next tile's NR rows are NR*K contiguous bytes: fetch them as one run (int8_gemm.h).
    if (prefetch && ((k * NR) & 63) < NR * 16)
      _mm_prefetch(reinterpret_cast<const char*>(W + (n + NR) * K + k * NR), _MM_HINT_T0);
    __m256i wv[NR];
    for (int i = 0; i < NR; ++i)
      wv[i] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(W + (n + i) * K + k)));
    for (int j = 0; j < MR; ++j) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(X + (m + j) * K + k));
      for (int i = 0; i < NR; ++i) acc[i][j] = _mm256_add_epi32(acc[i][j], _mm256_madd_epi16(wv[i], xv));
    }
    if (((k + 16) & (kBlock - 1)) == 0 || k + 16 == K) TANDEM_INT16_FLUSH(256, k / kBlock)
  }
  for (int i = 0; i < NR; ++i)
    for (int j = 0; j < MR; ++j)
      // An explicit fma: left to the compiler, some tile shapes fused it and others did not.
      O[(m + j) * N + n + i] = std::fma(tandem_avx2::hsum(_mm256_load_ps(sums + (i * MR + j) * 8)), S[n + i], B ? B[n + i] : 0.0f);
}

// The tiles over the row-major inputs, for tandem_tiles' walkers.
struct Tiles : tandem_int16::Buffers {
  template <int NR, int MR, typename P>
  void run(int64_t m, int64_t n, int64_t n_end, P prefetch) const { tile<NR, MR>(X, XS, W, S, B, O, m, n, n_end, K, N, prefetch); }
};

// Widths that are not a multiple of 16 (none in the supported models): one output at a time,
// the same arithmetic for every number of rows.
inline void linear_scalar(const int16_t* X, const float* XS, int64_t M, int64_t K, const int8_t* W, const float* S,
                          const float* B, int64_t N, float* O) {
  const int64_t nb = blocks(K);
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t m = 0; m < M; ++m) {
        float sum = 0.0f;
        for (int64_t b = 0; b < nb; ++b) {
          int32_t t = 0;
          for (int64_t k = b * kBlock; k < std::min(K, (b + 1) * kBlock); ++k) t += int32_t(W[n * K + k]) * X[m * K + k];
          sum = std::fma(static_cast<float>(t), XS[m * nb + b], sum);
        }
        O[m * N + n] = std::fma(sum, S[n], B ? B[n] : 0.0f);
      }
  });
}

// O[M, N] = sum over blocks of (Xq . W^T) * XS, times S[N], + B[N]; parallel over N.
inline void linear_into(const float* Xf, int64_t M, int64_t K, const int8_t* W, const float* S,
                        const float* B, int64_t N, float* O) {
  std::vector<int16_t> q(M * K);
  std::vector<float> qs(M * blocks(K));
  quantize_rows(Xf, M, K, q.data(), qs.data());
  const int16_t* X = q.data();
  const float* XS = qs.data();
  if (K % 16 != 0) return linear_scalar(X, XS, M, K, W, S, B, N, O);
  if (use_vnni(K)) return tandem_a16_vnni::linear_into(X, XS, M, K, W, S, B, N, O);
  const Tiles t{{X, XS, W, S, B, O, M, K, N}};
  const int64_t grain = tandem_tiles::grain(K, 64);
  if (M <= 9) {  // decoding and verification (a draft of up to 8 tokens plus one)
    at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
      using namespace tandem_tiles;
      switch (M) {  // prefetch as a bool for one chunk, as a type for several (tile)
        case 1: rows<4, 1>(t, 0, n0, n1, true); break;
        case 2: rows<4, 2>(t, 0, n0, n1, true); break;
        case 3: rows<3, 3>(t, 0, n0, n1, true); break;
        case 4: rows<2, 4>(t, 0, n0, n1, true); break;
        case 5: rows<2, 5>(t, 0, n0, n1, true); break;
        case 6: split_rows<3, 3, 3>(t, 0, n0, n1, Prefetch{}); break;
        case 7: split_rows<3, 3, 2, 2>(t, 0, n0, n1, Prefetch{}); break;
        case 8: split_rows<3, 3, 3, 2>(t, 0, n0, n1, Prefetch{}); break;
        default: split_rows<3, 3, 3, 3>(t, 0, n0, n1, Prefetch{}); break;
      }
    });
    return;
  }
  constexpr int64_t kRows = 16;  // weight rows kept in L1/L2 while every input row uses them
  tandem_tiles::parallel_blocks(N, grain, kRows, [&](int64_t n0, int64_t n1) {
    using tandem_tiles::rows;
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) rows<2, 4>(t, m, n0, n1, false);
    switch (M - m) {
      case 3: rows<3, 3>(t, m, n0, n1, false); break;
      case 2: rows<4, 2>(t, m, n0, n1, false); break;
      case 1: rows<4, 1>(t, m, n0, n1, false); break;
      default: break;
    }
  });
}

}  // namespace tandem_a16
