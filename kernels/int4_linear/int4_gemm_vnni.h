// int4 weights x int8 inputs on AVX-512 VNNI (Zen 4+, Ice Lake+): the contract of reference.py
// (the same integer dot products per group, the fp32 sums over groups in order), with half
// the AVX2 tiles' instructions or fewer. Included by int4_gemm.h, which dispatches to it.
//
// Why: the AVX2 tile needs two vpmaddubsw per 32 weights of a row and input row and a 16-bit
// reduction across rows before it can scale a group; its multi-row passes are bound by arithmetic. A
// panel holds a group's 4 weight rows in 64 contiguous bytes: here one 512-bit load takes all
// four, two vpdpbusd multiply-add their 128 codes by the row's inputs (broadcast to each row's
// 128-bit lane) into exact int32 sums, and one convert, scale and FMA fold the group into the
// four rows' fp32 sums at once.
//
// Batch invariance (kernels/int4_linear): per group, exact int32 sums (a lane adds 8 products
// of at most 15 * 127); per lane, the fp32 sum over the groups in order; then a fixed sum of a
// row's 4 lanes, and its offsets' sum as the AVX2 tiles take it (offset_sums8, for the tile's
// 4 or 8 weight rows at once). Every tile shape does exactly that for each row, so a row's
// result never depends on how many rows share the call. Whether these tiles or the AVX2 ones run depends on
// the CPU only (never on the rows), so plain decoding and verification always agree.
#pragma once
#include <immintrin.h>
#include <algorithm>
#include <cstdint>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")

namespace tandem_int4_vnni {

using tandem_int4::Args;
using tandem_int4::kGroup;
constexpr int64_t kAhead = 4096;  // bytes of codes (an eighth of that of scales) fetched ahead

// NP panels (4 weight rows each, from panel p) x MR input rows from m.
template <int NP, int MR>
inline void tile(const Args& a, int64_t m, int64_t p, bool prefetch) {
  const int64_t K = a.K, groups = K / kGroup;
  const __m512i mask = _mm512_set1_epi8(0x0F);
  const __m512i row_lane = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  __m512 acc[NP][MR];
  for (int i = 0; i < NP; ++i)
    for (int j = 0; j < MR; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512i lo[NP], hi[NP];
    __m512 scale[NP];
    // The tiles sweep the panels (and their scales) in memory order, NP lines a group: fetch
    // the lines kAhead bytes further along. Fetching only the next tile's panels left a one-row
    // step of a 896-wide layer (28 lines a panel, ~4 cycles a group) waiting on memory.
    if (prefetch) {
      const char* ahead = reinterpret_cast<const char*>(a.Q + (p * groups + g * NP) * 64) + kAhead;
      for (int i = 0; i < NP; ++i) _mm_prefetch(ahead + i * 64, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(a.S + (p * groups + g * NP) * 4) + kAhead / 8, _MM_HINT_T0);
    }
    for (int i = 0; i < NP; ++i) {
      const uint8_t* q = a.Q + ((p + i) * groups + g) * 64;
      const __m512i v = _mm512_loadu_si512(q);
      lo[i] = _mm512_and_si512(v, mask);                         // codes 0..15 of each row
      hi[i] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);   // codes 16..31
      const __m128i halves = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(a.S + ((p + i) * groups + g) * 4));
      scale[i] = _mm512_permutexvar_ps(row_lane, _mm512_castps128_ps512(_mm_cvtph_ps(halves)));
    }
    for (int j = 0; j < MR; ++j) {
      const int8_t* x = a.XQ + (m + j) * K + g * kGroup;
      const __m512i x_lo = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
      const __m512i x_hi = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 16)));
      const __m512 dx = _mm512_set1_ps(a.DX[(m + j) * groups + g]);
      for (int i = 0; i < NP; ++i) {
        const __m512i dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[i], x_lo), hi[i], x_hi);
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scale[i], dx), acc[i][j]);
      }
    }
  }
  for (int j = 0; j < MR; ++j) {
    alignas(32) float offsets[8];
    _mm256_store_ps(offsets, tandem_int4::offset_sums8<4 * NP>(a.Z + p * 4 * groups, a.XS + (m + j) * groups, groups));
    for (int i = 0; i < NP; ++i) {
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, acc[i][j]);
      for (int r = 0; r < 4; ++r) {
        const int64_t n = (p + i) * 4 + r;
        const float* l = lanes + 4 * r;
        const float dot = (l[0] + l[1]) + (l[2] + l[3]);
        a.O[(m + j) * a.N + n] = dot + offsets[i * 4 + r] + (a.B ? a.B[n] : 0.0f);
      }
    }
  }
}

// Input rows m .. m+MR-1 against panels p0 .. p1-1, two at a time (the inputs' loads serve
// both). On one 896 -> 4864, 4864 -> 896 and 1536 -> 8960 layer from memory, 2 threads: one row
// runs at the AVX2 tiles' speed (both memory-bound) with one panel per tile, and 8-23% slower
// with four; 2 rows 1.1-1.35x faster than AVX2, 5 rows 1.8-1.9x, a 53-row prefill 1.75-1.9x.
template <int MR>
inline void panels(const Args& a, int64_t m, int64_t p0, int64_t p1, bool prefetch) {
  int64_t p = p0;
  if constexpr (MR > 1)  // one row: a panel at a time is one stream, which memory serves fastest
    for (; p + 2 <= p1; p += 2) tile<2, MR>(a, m, p, prefetch);
  for (; p < p1; ++p) tile<1, MR>(a, m, p, prefetch);
}

// count: 1..9.
inline void rows(int64_t count, const Args& a, int64_t m, int64_t p0, int64_t p1, bool prefetch) {
  switch (count) {
    case 1: panels<1>(a, m, p0, p1, prefetch); break;
    case 2: panels<2>(a, m, p0, p1, prefetch); break;
    case 3: panels<3>(a, m, p0, p1, prefetch); break;
    case 4: panels<4>(a, m, p0, p1, prefetch); break;
    case 5: panels<5>(a, m, p0, p1, prefetch); break;
    case 6: panels<6>(a, m, p0, p1, prefetch); break;
    case 7: panels<7>(a, m, p0, p1, prefetch); break;
    case 8: panels<8>(a, m, p0, p1, prefetch); break;
    default: panels<9>(a, m, p0, p1, prefetch); break;
  }
}

constexpr int64_t kPanels = 4;  // 16 weight rows stay in L1 while every chunk of rows uses them

// Panels p0 .. p1-1 against all M input rows: verification (up to 9 rows) in one pass, a
// prefill in chunks of 8 (18-27 registers).
inline void panel_range(const Args& a, int64_t M, int64_t p0, int64_t p1) {
  const int64_t chunk = M <= 9 ? M : 8;
  for (int64_t m = 0; m < M; m += chunk) rows(std::min(chunk, M - m), a, m, p0, p1, m == 0);
}

inline void linear_into(const Args& a, int64_t M) {
  tandem_tiles::parallel_blocks(a.N / 4, tandem_int4::panel_grain(a.K), kPanels,
                                [&](int64_t p0, int64_t p1) { panel_range(a, M, p0, p1); });
}

}  // namespace tandem_int4_vnni

#pragma GCC pop_options
