// int8 weights x int16-quantized inputs on AVX-512 VNNI (Zen 4+, Ice Lake+): the same
// arithmetic as int16_inputs.h (the contract is reference.py's linear_a16), with bigger tiles.
//
// Why: verifying a few rows with the AVX2 tiles runs at ~30 GMAC/s per core, a quarter of what
// this machine's multiply units give. The AVX2 tile is capped by its 16 registers (NR*MR + NR
// <= 15, so 9 rows take three passes over each weight tile), and each product needs a separate
// add. Here vpdpwssd multiplies 32 int16 pairs and adds them into the sums in one instruction,
// and 32 registers hold a whole verification block: all 9 rows against 3 weight rows, so each
// weight is widened once per step whatever the number of rows.
//
// Batch invariance, as in int16_inputs.h: per block, exact int32 sums (a lane adds 2 products
// per 32 inputs: 16 per block, far below overflow); per lane, the fp32 sums over blocks in
// block order; then one fixed sum of the 16 lanes. Every tile shape does exactly this, so a
// row's result does not depend on how many rows are computed with it. Whether this file or
// the AVX2 one runs depends only on the CPU and K (never on M), so a layer's plain decoding
// and its verification always use the same one.
#pragma once
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "avx2_common.h"
#include "int16_blocks.h"
#include "tile_grid.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")

namespace tandem_a16_vnni {

using tandem_int16::kBlock;
constexpr int64_t kStep = 32;  // inputs per instruction (int16 pairs x 16 lanes)

// The sum of 16 lanes, always in the same order.
inline float hsum16(__m512 v) {
  return tandem_avx2::hsum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

// NR weight rows x MR input rows: NR*MR int32 sums + NR widened weight vectors in registers,
// the inputs read as memory operands; NR*MR + NR <= 30 leaves the flush two registers.
// X is step-major (pack_steps): the MR rows' 32 inputs of a step are adjacent, so one pointer
// with constant offsets reaches them all (one pointer per row ran out of general registers
// and GCC spilled them) and they stream in order.
template <int NR, int MR>
inline void tile(const int16_t* X, const float* XS, const int8_t* W, const float* S, const float* B, float* O,
                 int64_t M, int64_t m, int64_t n, int64_t n_end, int64_t K, int64_t N, bool may_prefetch) {
  static_assert(NR * MR + NR <= 30, "registers");
  TANDEM_INT16_TILE_STATE(512)
  const bool prefetch = may_prefetch && n + 2 * NR <= n_end;
  const char* next = reinterpret_cast<const char*>(W + (n + NR) * K);
  const int8_t* w = W + n * K;
  const int16_t* x = X + m * kStep;
  const int64_t steps_per_block = kBlock / kStep;
  int64_t block = 0, left = steps_per_block;  // counters: a division per block cost ~10%
  // One loop over k with the flush inside it as a macro: int16_inputs.h explains why.
  for (int64_t k = 0; k < K; k += kStep, x += M * kStep) {  // K % kStep == 0 (linear_into)
    // The next tile's NR rows are NR*K contiguous bytes; this step consumes NR*32 of them.
    // Every line of them: fetching only two a step let tiles of 5-6 rows fall behind (two
    // rows through 1536 -> 8960 took 1.00 ms against 0.64 for one).
    if (prefetch)
      for (int64_t line = 0; line < NR * kStep; line += 64) _mm_prefetch(next + k * NR + line, _MM_HINT_T0);
    __m512i wv[NR];
    for (int i = 0; i < NR; ++i)
      wv[i] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i * K + k)));
    for (int j = 0; j < MR; ++j) {
      __m512i xv = _mm512_load_si512(x + j * kStep);
      // Keep the row in a register: folded into each of the NR products (GCC's choice) it is
      // loaded NR times, and a 64-byte load a cycle is this loop's other limit.
      asm("" : "+v"(xv));
      for (int i = 0; i < NR; ++i) acc[i][j] = _mm512_dpwssd_epi32(acc[i][j], wv[i], xv);
    }
    if (--left == 0 || k + kStep == K) {
      TANDEM_INT16_FLUSH(512, block)
      ++block;
      left = steps_per_block;
    }
  }
  for (int i = 0; i < NR; ++i)
    for (int j = 0; j < MR; ++j)
      O[(m + j) * N + n + i] = std::fma(hsum16(_mm512_load_ps(sums + (i * MR + j) * 16)), S[n + i], B ? B[n + i] : 0.0f);
}

// The tiles over the step-major inputs, for tandem_tiles' walkers.
struct Tiles : tandem_int16::Buffers {
  template <int NR, int MR>
  void run(int64_t m, int64_t n, int64_t n_end, bool prefetch) const { tile<NR, MR>(X, XS, W, S, B, O, M, m, n, n_end, K, N, prefetch); }
};

// Input rows m0 .. m0+R-1 (R <= 9) of M against weight rows n0 .. n1-1. The tiles were picked
// by measuring one layer from memory on 2 threads (Zen 4). Short rows: the inputs stay in L1
// and few weight rows per tile did best (1536 -> 8960, 9 rows: NR 2 0.84 ms, NR 3 0.95; 5 rows:
// NR 3 0.53, NR 2 0.64; 4 rows: NR 6 0.50, NR 5 0.51-0.54, and the LM head 9.4 ms vs 10.0);
// long rows (8960 -> 1536): the inputs come from L2 and more weight rows share each load
// (NR 3 0.89 ms, NR 2 0.98). Bigger tiles and chunks of rows (as in int16_inputs.h) were slower.
inline void few_rows(const Tiles& t, int64_t m0, int64_t R, int64_t n0, int64_t n1, bool prefetch) {
  const bool long_rows = t.K * R * 2 > (24 << 10);  // the tile's inputs do not fit in L1
#define TANDEM_VNNI_TILE(NR, MR) { tandem_tiles::rows<NR, MR>(t, m0, n0, n1, prefetch); break; }
  switch (R) {
    case 1: TANDEM_VNNI_TILE(4, 1)
    case 2: TANDEM_VNNI_TILE(6, 2)
    case 3: if (long_rows) TANDEM_VNNI_TILE(4, 3) TANDEM_VNNI_TILE(3, 3)
    case 4: TANDEM_VNNI_TILE(6, 4)
    case 5: if (long_rows) TANDEM_VNNI_TILE(4, 5) TANDEM_VNNI_TILE(3, 5)
    case 6: if (long_rows) TANDEM_VNNI_TILE(4, 6) TANDEM_VNNI_TILE(3, 6)
    case 7: if (long_rows) TANDEM_VNNI_TILE(3, 7) TANDEM_VNNI_TILE(2, 7)
    case 8: if (long_rows) TANDEM_VNNI_TILE(3, 8) TANDEM_VNNI_TILE(2, 8)
    case 9: if (long_rows) TANDEM_VNNI_TILE(3, 9) TANDEM_VNNI_TILE(2, 9)
    default: break;
  }
#undef TANDEM_VNNI_TILE
}

// Q [M, K] row-major -> P step-major: P[(k / 32) * M * 32 + m * 32 + k % 32] = Q[m * K + k].
inline void pack_steps(const int16_t* Q, int64_t M, int64_t K, int16_t* P) {
  for (int64_t k = 0; k < K; k += kStep)
    for (int64_t m = 0; m < M; ++m)
      _mm512_store_si512(P + (k / kStep * M + m) * kStep, _mm512_loadu_si512(Q + m * K + k));
}

// O[M, N] from the quantized inputs Q [M, K] (int16_inputs.h quantizes them); K % kStep == 0.
inline void linear_into(const int16_t* Q, const float* XS, int64_t M, int64_t K, const int8_t* W, const float* S,
                        const float* B, int64_t N, float* O) {
  std::vector<int16_t> buffer(M * K + 32);  // + 64 bytes to align to them
  int16_t* X = reinterpret_cast<int16_t*>((reinterpret_cast<uintptr_t>(buffer.data()) + 63) & ~uintptr_t(63));
  pack_steps(Q, M, K, X);
  const Tiles t{{X, XS, W, S, B, O, M, K, N}};
  const int64_t grain = tandem_tiles::grain(K, 64);
  if (M <= 9) {  // decoding and verification (a draft of up to 8 tokens plus one)
    at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) { few_rows(t, 0, M, n0, n1, true); });
    return;
  }
  constexpr int64_t kRows = 24;  // weight rows kept in L1/L2 while every input row uses them
  tandem_tiles::parallel_blocks(N, grain, kRows, [&](int64_t n0, int64_t n1) {
    int64_t m = 0;
    for (; m + 8 <= M; m += 8) tandem_tiles::rows<3, 8>(t, m, n0, n1, false);
    few_rows(t, m, M - m, n0, n1, false);
  });
}

}  // namespace tandem_a16_vnni

#pragma GCC pop_options
