// int4-weight linear on raw buffers, shared by the extensions that need it (kernels/int4_linear,
// kernels/draft_decoder). int4_linear_avx2.cpp states the contract.
#pragma once
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "avx2_common.h"
#include "tile_grid.h"

namespace tandem_int4 {

using tandem_avx2::hsum;
constexpr int64_t kGroup = 32;

// One input row, quantized: xq [K] int8, dx [K/32] scales, xs [K/32] exact fp32 group sums.
struct Quantized {
  std::vector<int8_t> q;
  std::vector<float> d, sum;
};

// Per group: d = max|x| / 127 (1 when all zero), q = round_half_even(x / d); sum = the group's
// fp32 sum in a fixed order.
inline void quantize_rows(const float* X, int64_t M, int64_t K, Quantized& out) {
  const int64_t groups = K / kGroup;
  out.q.resize(M * K);
  out.d.resize(M * groups);
  out.sum.resize(M * groups);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < groups; ++g) {
      const float* x = X + m * K + g * kGroup;
      __m256 v[4];
      for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(x + 8 * i);
      const __m256 amax = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                        _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
      float d = tandem_avx2::hmax(amax) / 127.0f;
      if (!(d > 0.0f)) d = 1.0f;
      const __m256 dv = _mm256_set1_ps(d);
      __m256i qi[4];
      for (int i = 0; i < 4; ++i) qi[i] = _mm256_cvtps_epi32(_mm256_div_ps(v[i], dv));  // round half to even
      // 32 int32 -> 32 int8 in order (packs work per 128-bit lane: permute back).
      const __m256i w01 = _mm256_packs_epi32(qi[0], qi[1]), w23 = _mm256_packs_epi32(qi[2], qi[3]);
      __m256i b = _mm256_packs_epi16(w01, w23);
      b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.q.data() + m * K + g * kGroup), b);
      out.d[m * groups + g] = d;
      out.sum[m * groups + g] = hsum(_mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3])));
    }
}

// Panels (4 rows of K int4 weights: 2K bytes) to a thread, at least 2.
inline int64_t panel_grain(int64_t K) { return tandem_tiles::grain(2 * K, 2); }

struct Args {
  const int8_t* XQ;
  const float* DX;
  const float* XS;
  const uint8_t* Q;  // panels [N/4][K/32][4][16]
  const uint16_t* S;  // fp16 panels [N/4][K/32][4]
  const uint16_t* Z;
  const float* B;
  float* O;
  int64_t K, N;
};

// sum_g offset[n, g] * xsum[g] for ROWS (4 or 8) weight rows from the one at ``z`` and one input
// row, as a vector in row order (lanes past ROWS zero): per row an 8-lane FMA chain over the
// groups in blocks of 8, one fixed transposing sum of the 8 chains, then the last groups % 8 in
// order. Why not one 8-lane chain per output: its horizontal sum and scalar tail cost about a
// third of the AVX2 tile's own work per output on a 896-wide layer, and made the VNNI tiles'
// 64-row passes (a drafter's window of the prompt) 15% slower.
template <int ROWS>
inline __m256 offset_sums8(const uint16_t* z, const float* xs, int64_t groups) {
  __m256 acc[8];
  for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 8 <= groups; g += 8) {
    const __m256 x = _mm256_loadu_ps(xs + g);
    for (int r = 0; r < ROWS; ++r)
      acc[r] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(z + r * groups + g))), x, acc[r]);
  }
  // [r0: lanes 0-3, r1, r2, r3 | r0: lanes 4-7, r1, r2, r3] and the same for rows 4-7.
  const __m256 q0 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
  const __m256 q1 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
  __m256 sums = _mm256_add_ps(_mm256_permute2f128_ps(q0, q1, 0x20), _mm256_permute2f128_ps(q0, q1, 0x31));
  // (The tail's offsets go into a register lane by lane: through a stored array, the vector load
  // waited on the scalar stores at every group, and one row's pass ran 15% slower.)
  for (; g < groups; ++g) {
    const auto h = [&](int r) { return r < ROWS ? _cvtsh_ss(z[r * groups + g]) : 0.0f; };
    const __m256 zv = _mm256_setr_ps(h(0), h(1), h(2), h(3), h(4), h(5), h(6), h(7));
    sums = _mm256_fmadd_ps(zv, _mm256_set1_ps(xs[g]), sums);
  }
  return sums;
}

// NP panels (NP = 1 or 2: 4 or 8 weight rows from 4p) x input rows m .. m+MR-1. A 32-byte load
// holds one group of two weight rows (a row's 16 bytes in each 128-bit lane), its low nibbles
// codes 0-15 and its high ones 16-31, against the input's 16 values broadcast to both lanes:
// vpmaddubsw, the two halves added in 16 bits, pairwise sums across the 8 rows' registers
// (vphaddw twice) and one vpmaddwd leave each row's exact group sum in one int32 lane, so a
// single convert, scale and FMA per group folds all 8 rows into one fp32 accumulator. Why:
// working one weight row per register and converting, scaling and adding 8 lanes per row costs
// ~1.6x the instructions per weight, which made the drafter's multi-row passes (a prompt's
// window, catching up) bound by arithmetic on CPUs without AVX-512. The codes are unpacked
// once a group for every input row. Lanes hold the rows in the order kLaneRow; each row's
// arithmetic is the same in every lane and tile shape, so its bits never depend on the rows
// or panels computed beside it.
constexpr int kLaneRow[8] = {0, 2, 4, 6, 1, 3, 5, 7};

template <int NP, int MR>
inline void avx2_tile(const Args& a, int64_t m, int64_t p, bool prefetch) {
  const int64_t K = a.K, groups = K / kGroup;
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i lane_row = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kLaneRow));
  const uint8_t* q0 = a.Q + p * groups * 64;
  const uint8_t* q1 = q0 + (NP > 1 ? groups * 64 : 0);
  const uint16_t* s0 = a.S + p * groups * 4;
  const uint16_t* s1 = s0 + (NP > 1 ? groups * 4 : 0);
  __m256 acc[MR];
  for (int j = 0; j < MR; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    // The panels stream in order; the prefetchers stop at each 4 KB page.
    if (prefetch) {
      _mm_prefetch(reinterpret_cast<const char*>(q0 + g * 64 + 512), _MM_HINT_T0);
      if (NP > 1) _mm_prefetch(reinterpret_cast<const char*>(q1 + g * 64 + 512), _MM_HINT_T0);
    }
    __m256i lo[2 * NP], hi[2 * NP];
    for (int h = 0; h < 2 * NP; ++h) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>((h < 2 ? q0 : q1) + g * 64 + (h % 2) * 32));
      lo[h] = _mm256_and_si256(v, mask);
      hi[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    }
    // The 8 rows' fp16 scales (a lone panel's rows 4-7: its own again, their sums are zero).
    const __m128i halves = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s0 + g * 4)),
                                              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s1 + g * 4)));
    const __m256 scale = _mm256_permutevar8x32_ps(_mm256_cvtph_ps(halves), lane_row);
    for (int j = 0; j < MR; ++j) {
      const int8_t* x = a.XQ + (m + j) * K + g * kGroup;
      const __m256i x_lo = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
      const __m256i x_hi = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 16)));
      // Per 16-bit lane: two products of at most 15 * 127 (vpmaddubsw), the codes' halves added,
      // then two pairwise sums: at most 8 * 3,810 = 30,480, exact in int16.
      __m256i d[4];
      for (int h = 0; h < 2 * NP; ++h) d[h] = _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], x_lo), _mm256_maddubs_epi16(hi[h], x_hi));
      if (NP == 1) d[2] = d[3] = _mm256_setzero_si256();
      // [r0 x8 | r1 x8] .. [r6 x8 | r7 x8] -> [r0 x4 r2 x4 | r1 x4 r3 x4], [r4 r6 | r5 r7] ->
      // [r0 x2 r2 x2 r4 x2 r6 x2 | r1 .. r7] -> (vpmaddwd) [r0 r2 r4 r6 | r1 r3 r5 r7] in int32.
      const __m256i pairs = _mm256_hadd_epi16(_mm256_hadd_epi16(d[0], d[1]), _mm256_hadd_epi16(d[2], d[3]));
      const __m256i dot = _mm256_madd_epi16(pairs, ones);
      const __m256 sd = _mm256_mul_ps(scale, _mm256_set1_ps(a.DX[(m + j) * groups + g]));
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sd, acc[j]);
    }
  }
  for (int j = 0; j < MR; ++j) {
    alignas(32) float lanes[8], offsets[8];
    _mm256_store_ps(lanes, acc[j]);
    _mm256_store_ps(offsets, offset_sums8<4 * NP>(a.Z + p * 4 * groups, a.XS + (m + j) * groups, groups));
    for (int l = 0; l < 8; ++l) {
      const int row = kLaneRow[l];
      if (row >= 4 * NP) continue;
      const int64_t n = p * 4 + row;
      a.O[(m + j) * a.N + n] = lanes[l] + offsets[row] + (a.B ? a.B[n] : 0.0f);
    }
  }
}

// Input rows m .. m+count-1 (count 1..kRows) against panels p, p + 1 (or p alone).
constexpr int64_t kRows = 8;
template <int NP>
inline void panel_rows(int64_t count, const Args& a, int64_t m, int64_t p, bool prefetch) {
  switch (count) {
    case 1: avx2_tile<NP, 1>(a, m, p, prefetch); break;
    case 2: avx2_tile<NP, 2>(a, m, p, prefetch); break;
    case 3: avx2_tile<NP, 3>(a, m, p, prefetch); break;
    case 4: avx2_tile<NP, 4>(a, m, p, prefetch); break;
    case 5: avx2_tile<NP, 5>(a, m, p, prefetch); break;
    case 6: avx2_tile<NP, 6>(a, m, p, prefetch); break;
    case 7: avx2_tile<NP, 7>(a, m, p, prefetch); break;
    default: avx2_tile<NP, 8>(a, m, p, prefetch); break;
  }
}

}  // namespace tandem_int4

#include "int4_gemm_vnni.h"

namespace tandem_int4 {

// Whether the AVX-512 VNNI tiles (int4_gemm_vnni.h) run where the CPU has them: on unless the
// environment says TANDEM_AVX512=0; tests switch it per module. Never depends on the rows, so a
// process's plain decoding and verification agree.
inline bool& vnni_enabled() {
  static bool on = tandem_avx2::avx512_allowed_by_env();
  return on;
}

inline bool use_vnni() { return vnni_enabled() && tandem_avx2::cpu_has_avx512_vnni(); }

// "avx512_vnni" or "avx2": the tiles that run (for reports, tests).
inline const char* tile_set() { return tandem_avx2::tile_set_name(vnni_enabled()); }

// The AVX2 tiles over panels p0 .. p1-1 against all M input rows.
// Two panels a tile; more input rows than a tile holds run in chunks, later ones finding the
// panels in L1.
inline void panel_range(const Args& a, int64_t M, int64_t p0, int64_t p1) {
  int64_t p = p0;
  if (M > 2)  // a row or two: a panel at a time is one stream, which memory serves fastest (same bits)
    for (; p + 2 <= p1; p += 2)
      for (int64_t m = 0; m < M; m += kRows) panel_rows<2>(std::min(kRows, M - m), a, m, p, m == 0);
  for (; p < p1; ++p)
    for (int64_t m = 0; m < M; m += kRows) panel_rows<1>(std::min(kRows, M - m), a, m, p, m == 0);
}

inline void linear_into(const Args& a, int64_t M) {
  if (use_vnni()) return tandem_int4_vnni::linear_into(a, M);
  // Split across threads only when each gets enough weights to amortize waking it (~32 KB).
  at::parallel_for(0, a.N / 4, panel_grain(a.K), [&](int64_t p0, int64_t p1) { panel_range(a, M, p0, p1); });
}

// Several weights on the same quantized input (a decoder layer's q / k / v, or gate / up), in
// one parallel region over all their panels: a thread is woken once, not once per weight, and
// the small k / v projections (~60 KB each on a 0.5B drafter) no longer pay a region of their
// own. Each panel runs the tiles linear_into runs for it, so every output has the bits the
// weight's own call gives.
inline void linear_group_into(const Args* weights, int count, int64_t M) {
  int64_t total = 0;
  for (int i = 0; i < count; ++i) total += weights[i].N / 4;
  const bool vnni = use_vnni();
  // In blocks of the VNNI walk's panels on both tile sets (a panel's bits do not depend on its block).
  tandem_tiles::parallel_blocks(total, panel_grain(weights[0].K), tandem_int4_vnni::kPanels, [&](int64_t p0, int64_t p1) {
    int64_t first = 0;  // the group's panel index of weight i's panel 0
    for (int i = 0; i < count && first < p1; first += weights[i].N / 4, ++i) {
      const int64_t lo = std::max(p0, first) - first, hi = std::min(p1, first + weights[i].N / 4) - first;
      if (lo >= hi) continue;
      if (vnni)
        tandem_int4_vnni::panel_range(weights[i], M, lo, hi);
      else
        panel_range(weights[i], M, lo, hi);
    }
  });
}

// O[M, N] = X[M, K] . W'^T (+ B): quantizes X's rows, then runs the tiles.
inline void linear_into(const float* X, int64_t M, int64_t K, const uint8_t* Q, const uint16_t* S, const uint16_t* Z,
                        const float* B, int64_t N, float* O) {
  Quantized xq;
  quantize_rows(X, M, K, xq);
  const Args a{xq.q.data(), xq.d.data(), xq.sum.data(), Q, S, Z, B, O, K, N};
  linear_into(a, M);
}

// Checks int4 weights against the input width K; returns N.
inline int64_t check_weight(const torch::Tensor& packed, const torch::Tensor& scale, const torch::Tensor& offset, int64_t K) {
  TORCH_CHECK(K % kGroup == 0, "int4 linear: input width must be a multiple of 32");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 4 && packed.size(1) == K / kGroup &&
                  packed.size(2) == 4 && packed.size(3) == 16 && packed.is_contiguous(),
              "int4 linear: packed weights must be contiguous panels [N/4, K/32, 4, 16] uint8");
  const int64_t N = packed.size(0) * 4;
  TORCH_CHECK(scale.scalar_type() == at::kHalf && scale.dim() == 3 && scale.size(0) == N / 4 &&
                  scale.size(1) == K / kGroup && scale.size(2) == 4 && scale.is_contiguous(),
              "int4 linear: scales must be contiguous fp16 panels [N/4, K/32, 4]");
  TORCH_CHECK(offset.scalar_type() == at::kHalf && offset.dim() == 2 && offset.size(0) == N &&
                  offset.size(1) == K / kGroup && offset.is_contiguous(),
              "int4 linear: offsets must be contiguous fp16 [N, K/32]");
  return N;
}

inline const uint16_t* half_ptr(const torch::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr<at::Half>()); }

}  // namespace tandem_int4
