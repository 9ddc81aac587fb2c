// The fp32-input tiles of the weight-only linear kernels, one template over the weight format:
// bf16 weights (kernels/linear) and int8 weights with a scale per output row (kernels/quant_linear,
// int8_gemm.h). O[m, n] = (sum_k X[m, k] * W[n, k]) (* S[n]) + B[n], weights widened to fp32 in
// registers.
//
// Batch invariance: each output element has exactly one accumulator, summed in k order and
// reduced by hsum, then the same scalar tail and epilogue, in every tile shape. So its value does
// not depend on the tile shape, hence not on M, and the shapes below are a matter of speed only.
#pragma once
#include <immintrin.h>
#include <cstdint>
#include <type_traits>

#include "avx2_common.h"
#include "tile_grid.h"

namespace tandem_fp32 {

// A weight format and the tile shapes its kernel measured best. Both formats use the same
// shapes for 2..9 input rows (few_rows); they differ in
//   kOneRowNR       weight rows per tile for one input row (decoding, drafting)
//   kWidenLate      with one input row, widen each weight vector just before its FMA rather than
//                   all NR first (int8's 8-row tile would not fit the registers otherwise)
//   kLastChunkMax   prefill: rows left after the 6-row chunks that go in one last chunk (7 runs
//                   as 4 + 3: no tile of 7 rows fits the registers)
//   kLastRowNR,     prefill: the tile for a single row left over, and whether it prefetches
//   kLastRowPrefetch
struct Bf16 {
  using Weight = uint16_t;  // the top half of an fp32
  static __m256 load8(const Weight* p) { return tandem_avx2::load_bf16x8(p); }
  static float widen(Weight w) { return tandem_avx2::bf16_to_float(w); }
  static float scaled(float s, const float*, int64_t) { return s; }
  static constexpr int kOneRowNR = 4;
  static constexpr bool kWidenLate = false;
  static constexpr int kLastChunkMax = 7;
  static constexpr int kLastRowNR = 4;
  static constexpr bool kLastRowPrefetch = false;
};

struct Int8 {
  using Weight = int8_t;
  static __m256 load8(const Weight* p) { return tandem_avx2::load_i8x8(p); }
  static float widen(Weight w) { return static_cast<float>(w); }
  static float scaled(float s, const float* S, int64_t n) { return s * S[n]; }
  static constexpr int kOneRowNR = 8;
  static constexpr bool kWidenLate = true;
  static constexpr int kLastChunkMax = 5;
  static constexpr int kLastRowNR = 8;
  static constexpr bool kLastRowPrefetch = true;
};

// Int8 on a block of 16 rows unpacked from the panel layout (int8_gemm.h): a single row left
// over runs in tiles of 4.
struct Int8Unpacked : Int8 {
  static constexpr int kLastRowNR = 4;
};

// NR weight rows x MR input rows: NR*MR independent accumulators hide the FMA latency and every
// widened weight vector is reused MR times.
//
// Registers: NR widened weight vectors + NR*MR accumulators + one input vector (<= 16). Holding
// the input vector while it meets every weight row reads each input row once per tile rather
// than once per weight row: with 6 rows of K = 1536 the inputs spill out of L1, and those reads
// (not the FMAs, not the weights) were what made 6 rows cost 2x one row.
//
// PREFETCH fetches the next tile's weight rows ahead: one input row (decoding, drafting) and
// verification's few rows are bound by streaming the weights from memory, and the hardware
// prefetcher barely ramps up within a short row (896 bytes for a 0.5B model in int8).
template <typename F, int NR, int MR, bool PREFETCH>
inline void tile(const float* X, const typename F::Weight* W, const float* S, const float* B, float* O,
                 int64_t m, int64_t n, int64_t n_end, int64_t K, int64_t N) {
  constexpr int64_t kBytes = sizeof(typename F::Weight);
  __m256 acc[NR][MR];
  for (int i = 0; i < NR; ++i)
    for (int j = 0; j < MR; ++j) acc[i][j] = _mm256_setzero_ps();
  const bool prefetch = PREFETCH && n + 2 * NR <= n_end;
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    // The next tile's NR rows are NR*K contiguous weights: fetch them as one run, a line each
    // time this tile's reads cross one. Fetching each row's next line every 64 bytes (NR short
    // runs at once) read 1536-wide int8 rows at ~10 GB/s, one run at ~14 GB/s (one row 1.50 ->
    // 1.00 ms).
    if (prefetch && ((k * kBytes * NR) & 63) < NR * 8 * kBytes) {
      _mm_prefetch(reinterpret_cast<const char*>(W + (n + NR) * K) + k * kBytes * NR, _MM_HINT_T0);
    }
    if constexpr (F::kWidenLate && MR == 1) {
      for (int i = 0; i < NR; ++i)
        acc[i][0] = _mm256_fmadd_ps(_mm256_loadu_ps(X + m * K + k), F::load8(W + (n + i) * K + k), acc[i][0]);
    } else {
      __m256 wv[NR];
      for (int i = 0; i < NR; ++i) wv[i] = F::load8(W + (n + i) * K + k);
      for (int j = 0; j < MR; ++j) {
        const __m256 xv = _mm256_loadu_ps(X + (m + j) * K + k);
        for (int i = 0; i < NR; ++i) acc[i][j] = _mm256_fmadd_ps(xv, wv[i], acc[i][j]);
      }
    }
  }
  for (int i = 0; i < NR; ++i) {
    const typename F::Weight* wr = W + (n + i) * K;
    for (int j = 0; j < MR; ++j) {
      const float* xr = X + (m + j) * K;
      float s = tandem_avx2::hsum(acc[i][j]);
      for (int64_t kk = k; kk < K; ++kk) s += xr[kk] * F::widen(wr[kk]);
      O[(m + j) * N + n + i] = F::scaled(s, S, n + i) + (B ? B[n + i] : 0.0f);
    }
  }
}

// The tiles over raw buffers, for tandem_tiles' walkers. S: the per-row scales (unread for bf16).
template <typename F>
struct Tiles {
  const float* X;
  const typename F::Weight* W;
  const float* S;
  const float* B;
  float* O;
  int64_t K, N;

  template <int NR, int MR, bool PREFETCH>
  void run(int64_t m, int64_t n, int64_t n_end, std::bool_constant<PREFETCH>) const {
    tile<F, NR, MR, PREFETCH>(X, W, S, B, O, m, n, n_end, K, N);
  }
};

// Decoding (1 row) and verification (2..9 rows: a draft of up to 8 tokens plus one) against
// weight rows n0 .. n1-1: stream the weights once, prefetching ahead. Tile shapes measured on
// Zen 3 (bf16, 2 threads, 8 distinct 1536x8960 weights so memory is real): 3 weight rows x 4
// input rows beat 2 x 4 by ~8% at 8 rows; 9 rows in the prefill tiles cost 2.2x one row, in
// chunks of 3 rows 1.6x.
template <typename F>
inline void few_rows(const Tiles<F>& t, int64_t M, int64_t n0, int64_t n1) {
  using namespace tandem_tiles;
  switch (M) {
    case 1: rows<F::kOneRowNR, 1>(t, 0, n0, n1, Prefetch{}); break;
    case 2: rows<4, 2>(t, 0, n0, n1, Prefetch{}); break;
    case 3: rows<3, 3>(t, 0, n0, n1, Prefetch{}); break;
    case 4: rows<3, 4>(t, 0, n0, n1, Prefetch{}); break;
    case 5: rows<2, 5>(t, 0, n0, n1, Prefetch{}); break;
    case 6: rows<2, 6>(t, 0, n0, n1, Prefetch{}); break;
    case 7: split_rows<3, 4, 3>(t, 0, n0, n1, Prefetch{}); break;
    case 8: split_rows<3, 4, 4>(t, 0, n0, n1, Prefetch{}); break;
    default: split_rows<3, 3, 3, 3>(t, 0, n0, n1, Prefetch{}); break;
  }
}

// Prefill (many rows) against weight rows n0 .. n1-1, a block that stays in L1/L2 while every
// input row passes over it: chunks of 6 rows, then what is left in one last chunk.
template <typename F>
inline void many_rows(const Tiles<F>& t, int64_t M, int64_t n0, int64_t n1) {
  using namespace tandem_tiles;
  int64_t m = 0;
  for (; M - m > F::kLastChunkMax; m += 6) rows<2, 6>(t, m, n0, n1, NoPrefetch{});
  switch (M - m) {
    case 7:
      if constexpr (F::kLastChunkMax >= 7) {
        rows<2, 4>(t, m, n0, n1, NoPrefetch{});
        rows<2, 3>(t, m + 4, n0, n1, NoPrefetch{});
      }
      break;
    case 6:
      if constexpr (F::kLastChunkMax >= 6) rows<2, 6>(t, m, n0, n1, NoPrefetch{});
      break;
    case 5: rows<2, 5>(t, m, n0, n1, NoPrefetch{}); break;
    case 4: rows<2, 4>(t, m, n0, n1, NoPrefetch{}); break;
    case 3: rows<3, 3>(t, m, n0, n1, NoPrefetch{}); break;
    case 2: rows<4, 2>(t, m, n0, n1, NoPrefetch{}); break;
    case 1: rows<F::kLastRowNR, 1>(t, m, n0, n1, std::bool_constant<F::kLastRowPrefetch>{}); break;
    default: break;
  }
}

// O[M, N] over the row layout W [N, K], parallel over N with at least ``grain`` weight rows to
// a thread.
template <typename F>
inline void linear_into(const Tiles<F>& t, int64_t M, int64_t grain) {
  if (M <= 9) {
    at::parallel_for(0, t.N, grain, [&](int64_t n0, int64_t n1) { few_rows(t, M, n0, n1); });
    return;
  }
  constexpr int64_t kBlock = 16;  // weight rows kept in L1/L2 while all input rows use them
  tandem_tiles::parallel_blocks(t.N, grain, kBlock, [&](int64_t n0, int64_t n1) { many_rows(t, M, n0, n1); });
}

}  // namespace tandem_fp32
