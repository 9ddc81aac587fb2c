// GGUF blocks x int8 inputs on AVX-512 VNNI (Zen 4+, Ice Lake+): the same exact integers as the
// AVX2 tiles (gguf_formats_avx2.h), so the same bits, with fewer multiplies.
//
// Why: vpmaddubsw + vpmaddwd cost two multiplies per 32 products on AVX2; vpdpbusd does the
// products and their sums by four in one. K-quants: vpdpbusd over 64 codes gives each sub-block's
// products summed by four into int32 lanes (at most 4 * 63 * 127 = 32004: an int16 holds it),
// two such results pack to int16 (vpackssdw, exact) and one vpdpwssd multiplies them by their
// sub-block scales and adds them up: 3 multiplies per 128 products where AVX2 pays 8. The legacy
// types take vpdpbusd on 32 codes (Q8_0's signed codes offset by 128, taken back off with the
// input sums). Included by gguf_linear_avx2.cpp after gguf_formats_avx2.h.
#pragma once
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstring>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")

namespace tandem_gguf_vnni {

using tandem_gguf::Inputs;
using tandem_gguf_avx2::load128;
using tandem_gguf_avx2::load256;
using tandem_gguf_avx2::nibbles32;
constexpr int kMaxRows = 10;  // a verification block of up to 10 rows in one pass (32 registers)

inline __m512i load512(const void* p) { return _mm512_loadu_si512(p); }

// 32 bytes -> 64 values in order: their low nibbles, then their high ones.
inline __m512i nibbles64(const uint8_t* p) {
  const __m512i bytes = _mm512_broadcast_i64x4(load256(p));
  const __m512i shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
  return _mm512_and_si512(_mm512_srlv_epi64(bytes, shift), _mm512_set1_epi8(0x0F));
}

// The scale of each int16 word of packs(dot(a), dot(b)) for 64 + 64 values a, b: word w of
// 128-bit lane q holds int32 lane 4q + (w & 3) of a (w < 4) or of b, each lane 4 values of one
// sub-block.
// Tables known at compile time (a vpermw index per half super-block).
struct ScaleIndex {
  alignas(64) int16_t idx[4][32];  // [Q4_K/Q5_K h = 0, 1; Q6_K h = 0, 1]
};

constexpr ScaleIndex make_scale_index() {
  ScaleIndex s{};
  for (int t = 0; t < 4; ++t) {
    const int h = t & 1;
    for (int q = 0; q < 4; ++q)
      for (int w = 0; w < 8; ++w) {
        const int lane = 4 * q + (w & 3);
        const bool second = w >= 4;  // from b (else a)
        // Q4_K/Q5_K: a = sub-blocks [4h | 4h+2] (lanes 0-7 | 8-15), b = [4h+1 | 4h+3];
        // Q6_K: a = sub-blocks 8h .. 8h+3 (4 lanes each), b = 8h+4 .. 8h+7.
        const int sub = t < 2 ? 4 * h + (lane >= 8 ? 2 : 0) + (second ? 1 : 0) : 8 * h + (second ? 4 : 0) + lane / 4;
        s.idx[t][8 * q + w] = static_cast<int16_t>(sub);
      }
  }
  return s;
}

inline constexpr ScaleIndex kScaleIndex = make_scale_index();

inline __m512i packed_scale_index(int table) { return _mm512_load_si512(kScaleIndex.idx[table]); }

// acc += sum of each sub-block's products times its scale, for 64 + 64 values a, b.
inline __m512i scaled_dot(__m512i acc, __m512i a, __m512i b, const int8_t* x, __m512i scales) {
  const __m512i da = _mm512_dpbusd_epi32(_mm512_setzero_si512(), a, load512(x));
  const __m512i db = _mm512_dpbusd_epi32(_mm512_setzero_si512(), b, load512(x + 64));
  return _mm512_dpwssd_epi32(acc, _mm512_packs_epi32(da, db), scales);
}

// z[0..7]: 8 weight rows' 16 int32 lanes each -> one vector holding each row's lane sum, in
// order (exact, so the same S as any other order): unpacks of row pairs, then of pairs of
// pairs, then the four 128-bit lanes folded. 24 single-uop instructions, where folding each row
// to 8 lanes and summing those with hadds took ~37 uops: a verified row's K-quant work is
// these sums more than anything but the dot products.
inline __m256i reduce_lanes(const __m512i* z) {
  __m512i p[4];
  for (int k = 0; k < 4; ++k)
    p[k] = _mm512_add_epi32(_mm512_unpacklo_epi32(z[2 * k], z[2 * k + 1]), _mm512_unpackhi_epi32(z[2 * k], z[2 * k + 1]));
  // 128-bit lane q of p[k]: [row 2k, row 2k+1, row 2k, row 2k+1] partial sums.
  const __m512i q0 = _mm512_add_epi32(_mm512_unpacklo_epi64(p[0], p[1]), _mm512_unpackhi_epi64(p[0], p[1]));
  const __m512i q1 = _mm512_add_epi32(_mm512_unpacklo_epi64(p[2], p[3]), _mm512_unpackhi_epi64(p[2], p[3]));
  // 128-bit lane q of q0: rows 0..3's sums over their lane q; q1: rows 4..7's.
  const __m512i r = _mm512_add_epi32(_mm512_shuffle_i64x2(q0, q1, _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_i64x2(q0, q1, _MM_SHUFFLE(3, 2, 3, 2)));
  // r: [rows 0-3 (lanes 0+2), rows 0-3 (1+3), rows 4-7 (0+2), rows 4-7 (1+3)].
  const __m512i t = _mm512_add_epi32(r, _mm512_shuffle_i64x2(r, r, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_castsi512_si256(_mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 4, 5, 0, 1, 4, 5), t));
}

template <bool kFive>
struct QK {  // Q4_K, Q5_K: inputs interleaved (Inputs::pairs)
  static constexpr int kValues = 256, kBytes = kFive ? 176 : 144, kOffset = 0, kMins = 1, kHalves = 0;
  static constexpr bool kDHigh = false, kNegate = true, kWholeTile = false;

  using Lanes = __m512i;

  template <int MR>
  static void sums(const uint8_t* blk, const Inputs& in, int64_t b, int64_t m0, __m512i* s, __m128i* mins, int stride) {
    const __m256i sm = _mm256_cvtepu8_epi16(tandem_gguf::k_scales_mins(blk + 4));  // scales 0..7, mins 0..7
    const __m512i sm512 = _mm512_castsi256_si512(sm);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i high = kFive ? _mm512_broadcast_i64x4(load256(blk + 16)) : _mm512_setzero_si512();
    __m512i acc[MR];
    for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      // 64 bytes: the low nibbles are sub-blocks 4h and 4h+2, the high ones 4h+1 and 4h+3 (the
      // inputs come interleaved to match: gguf_inputs.h).
      const __m512i v = load512(blk + (kFive ? 48 : 16) + 64 * h);
      __m512i a = _mm512_and_si512(v, m4), c = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
      if constexpr (kFive) {
        const int j = 4 * h;  // bit j of qh byte l: the fifth bit of sub-block j's value l
        const __m512i shift_a = _mm512_setr_epi64(j, j, j, j, j + 2, j + 2, j + 2, j + 2);
        const __m512i shift_c = _mm512_setr_epi64(j + 1, j + 1, j + 1, j + 1, j + 3, j + 3, j + 3, j + 3);
        const __m512i one = _mm512_set1_epi8(1);
        a = _mm512_or_si512(a, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi64(high, shift_a), one), 4));
        c = _mm512_or_si512(c, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi64(high, shift_c), one), 4));
      }
      const __m512i scales = _mm512_permutexvar_epi16(packed_scale_index(h), sm512);
      for (int r = 0; r < MR; ++r) acc[r] = scaled_dot(acc[r], a, c, in.row(m0 + r) + b * 256 + 128 * h, scales);
    }
    for (int r = 0; r < MR; ++r) s[r * stride] = acc[r];
    *mins = _mm256_extracti128_si256(sm, 1);
  }
};

struct Q6K {
  static constexpr int kValues = 256, kBytes = 210, kOffset = 0, kMins = 0, kHalves = 206;  // d at 208
  static constexpr bool kDHigh = true, kNegate = false, kWholeTile = false;

  using Lanes = __m512i;

  template <int MR>
  static void sums(const uint8_t* blk, const Inputs& in, int64_t b, int64_t m0, __m512i* s, __m128i*, int stride) {
    const __m256i sc16 = _mm256_cvtepi8_epi16(load128(blk + 192));
    const __m512i sc512 = _mm512_castsi256_si512(sc16);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(3);
    __m512i acc[MR];
    for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      // Values 128h + 0..63 are the low nibbles of ql's 64 bytes, + 64..127 their high ones; the
      // top two bits of value 128h + 32t + l are bits 2t of qh byte 32h + l.
      const __m512i ql = load512(blk + 64 * h);
      const __m512i qh = _mm512_broadcast_i64x4(load256(blk + 128 + 32 * h));
      const __m512i top01 = _mm512_srlv_epi64(qh, _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2));
      const __m512i top23 = _mm512_srlv_epi64(qh, _mm512_setr_epi64(4, 4, 4, 4, 6, 6, 6, 6));
      const __m512i a = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_slli_epi16(_mm512_and_si512(top01, m3), 4));
      const __m512i c = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                        _mm512_slli_epi16(_mm512_and_si512(top23, m3), 4));
      const __m512i scales = _mm512_permutexvar_epi16(packed_scale_index(2 + h), sc512);
      for (int r = 0; r < MR; ++r) acc[r] = scaled_dot(acc[r], a, c, in.row(m0 + r) + b * 256 + 128 * h, scales);
    }
    // The codes above are 0..63: take 32 * sum_j sc_j * xs16_j back off.
    for (int r = 0; r < MR; ++r)
      s[r * stride] = _mm512_sub_epi32(
          acc[r], _mm512_zextsi256_si512(_mm256_slli_epi32(_mm256_madd_epi16(sc16, load256(in.sums16(m0 + r) + b * 16)), 5)));
  }
};

// 4 registers, each [row 2k's 8 int32 lanes | row 2k+1's] -> the 8 rows' lane sums, in order
// (exact): pairs of 128-bit lanes summed with unpacks, then one permute.
inline __m256i sum_row_pairs(const __m512i* z) {
  const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(z[0], z[1]), _mm512_unpackhi_epi32(z[0], z[1]));
  const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(z[2], z[3]), _mm512_unpackhi_epi32(z[2], z[3]));
  // 128-bit lane q of t: [z0, z1, z2, z3]'s sums over their lane q; q = 0, 1: rows 0, 2, 4, 6
  // (first, second half), q = 2, 3: rows 1, 3, 5, 7.
  const __m512i t = _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
  const __m512i u = _mm512_add_epi32(t, _mm512_shuffle_i64x2(t, t, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512i order = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, u));
}

// The legacy types: S = codes . x per block of 32 (the offset of Q4_0 / Q5_0 / Q8_0 comes after),
// two rows' blocks to a register against the block's inputs in both halves, so a tile's 8 rows
// take 4 vpdpbusd and one reduction per input row.
template <int kBlockBytes, int kCodeOffset, int kMinsKind, class Codes>
struct Legacy {
  static constexpr int kValues = 32, kBytes = kBlockBytes, kOffset = kCodeOffset, kMins = kMinsKind, kHalves = 0;
  static constexpr bool kDHigh = false, kNegate = false, kWholeTile = true;

  template <int MR>
  static void tile_sums(const uint8_t* const* rows, int64_t b, const Inputs& in, int64_t m0, __m256i* S) {
    __m512i codes[4];
    for (int k = 0; k < 4; ++k)
      codes[k] = _mm512_inserti64x4(_mm512_castsi256_si512(Codes::get(rows[2 * k] + b * kBytes)),
                                    Codes::get(rows[2 * k + 1] + b * kBytes), 1);
    for (int r = 0; r < MR; ++r) {
      const __m512i x = _mm512_broadcast_i64x4(load256(in.row(m0 + r) + b * 32));
      __m512i z[4];
      for (int k = 0; k < 4; ++k) z[k] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes[k], x);
      S[r] = sum_row_pairs(z);
    }
  }
};

struct Q40Codes { static __m256i get(const uint8_t* blk) { return nibbles32(blk + 2); } };
struct Q41Codes { static __m256i get(const uint8_t* blk) { return nibbles32(blk + 4); } };
// Q5_0 / Q5_1: the 32 high bits are a mask register as they lie: add 16 where set.
inline __m256i five_bits(const uint8_t* nibbles, const uint8_t* high) {
  uint32_t bits;
  std::memcpy(&bits, high, 4);
  const __m256i q = nibbles32(nibbles);
  return _mm256_mask_add_epi8(q, _cvtu32_mask32(bits), q, _mm256_set1_epi8(16));
}

struct Q50Codes { static __m256i get(const uint8_t* blk) { return five_bits(blk + 6, blk + 2); } };
struct Q51Codes { static __m256i get(const uint8_t* blk) { return five_bits(blk + 8, blk + 4); } };
struct Q80Codes { static __m256i get(const uint8_t* blk) { return _mm256_xor_si256(load256(blk + 2), _mm256_set1_epi8(-128)); } };

using Q40 = Legacy<18, 8, 0, Q40Codes>;
using Q41 = Legacy<20, 0, 2, Q41Codes>;
using Q50 = Legacy<22, 16, 0, Q50Codes>;
using Q51 = Legacy<24, 0, 2, Q51Codes>;
using Q80 = Legacy<34, 128, 0, Q80Codes>;  // codes w + 128 in 0..255

using Q4K = QK<false>;
using Q5K = QK<true>;

#include "gguf_tiles.h"  // run, dispatch

// These tiles compute from the file's layout only.
inline bool packed_column(int64_t, const Job&, int64_t, int64_t) { return false; }

}  // namespace tandem_gguf_vnni

#pragma GCC pop_options
