// GGUF blocks x int8 inputs on AVX2: per type, the int32 lanes of one weight row's block against
// a few input rows (gguf_tiles.h sums them and does the fp32 steps). The products are
// vpmaddubsw (unsigned codes x signed inputs, pairs to int16: at most 2 * 63 * 127, never
// saturating) then vpmaddwd by the sub-block scale (K-quants) or by 1, so each lane is exact.
#pragma once
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "gguf_inputs.h"

namespace tandem_gguf {

// Q4_K / Q5_K's 12 bytes of 6-bit scales and mins (at p; p + 12 .. p + 15 are read, unused)
// -> 16 bytes: scales 0..7, then mins 0..7 (blocks.py's k_scales_mins). In 32-bit words u0..u2:
//   [u0 & 0x3f.., (u2 & 0x0f..) | ((u0 >> 6) & 0x03..) << 4, u1 & 0x3f.., (u2 >> 4 & 0x0f..) | ((u1 >> 6) & 0x03..) << 4]
inline __m128i k_scales_mins(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i a = _mm_srlv_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4));
  const __m128i low = _mm_and_si128(a, _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
  const __m128i b = _mm_srli_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)), 6);
  const __m128i high = _mm_slli_epi32(_mm_and_si128(b, _mm_setr_epi32(0, 0x03030303, 0, 0x03030303)), 4);
  return _mm_or_si128(low, high);
}

// The same from a block ``blk`` of the file (its scales at blk + 4, the 4 bytes after them not
// read: a layout made at load may pack a file's last block) -> sm[16].
inline void k_scales_mins_of(const uint8_t* blk, uint8_t* sm) {
  uint8_t scale_bytes[16] = {0};
  std::memcpy(scale_bytes, blk + 4, 12);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(sm), k_scales_mins(scale_bytes));
}

}  // namespace tandem_gguf

namespace tandem_gguf_avx2 {

using tandem_gguf::Inputs;
constexpr int kMaxRows = 8;  // input rows a tile computes at once: accumulators + codes fit 16 registers

inline __m256i load256(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m128i load128(const void* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// The int16 word j of each 128-bit lane, in every word (a vpshufb mask).
inline __m256i word_mask(int j) { return _mm256_set1_epi16(static_cast<short>(((2 * j + 1) << 8) | (2 * j))); }

// Legacy blocks: 16 bytes of nibbles -> 32 codes in order (low nibbles, then high).
inline __m256i nibbles32(const uint8_t* p) {
  const __m256i bytes = _mm256_broadcastsi128_si256(load128(p));
  return _mm256_and_si256(_mm256_srlv_epi64(bytes, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}

// Q5_0 / Q5_1: the little-endian uint32 of high bits -> 0x10 in byte j where bit j is set.
inline __m256i high_bits32(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                                             _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201);
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

// 32 codes x 32 inputs -> 8 int32 lanes (each the sum of 4 adjacent products).
inline __m256i dot32(__m256i codes, const int8_t* x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(codes, load256(x)), _mm256_set1_epi16(1));
}

struct Q4K {
  static constexpr int kValues = 256, kBytes = 144, kOffset = 0, kMins = 1, kHalves = 0;
  static constexpr bool kDHigh = false, kNegate = true, kWholeTile = false;

  // Sub-blocks 2p and 2p+1 of codes (lo, hi) times their scales, added to acc.
  template <int MR>
  static void pair(__m256i lo, __m256i hi, __m256i scales, int p, const Inputs& in, int64_t at, int64_t m0, __m256i* acc) {
    const __m256i sl = _mm256_shuffle_epi8(scales, word_mask(2 * p)), sh = _mm256_shuffle_epi8(scales, word_mask(2 * p + 1));
    for (int r = 0; r < MR; ++r) {
      const int8_t* x = in.row(m0 + r) + at + 64 * p;
      const __m256i pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load256(x)), sl);
      const __m256i ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load256(x + 32)), sh);
      acc[r] = _mm256_add_epi32(acc[r], _mm256_add_epi32(pl, ph));
    }
  }

  template <int MR>
  static void finish(const __m256i* acc, __m128i mins, __m256i* s, __m128i* mins_out, int stride) {
    for (int r = 0; r < MR; ++r) s[r * stride] = acc[r];
    *mins_out = mins;
  }

  template <int MR>
  static void sums(const uint8_t* blk, const Inputs& in, int64_t b, int64_t m0, __m256i* s, __m128i* mins, int stride) {
    const __m256i sm = _mm256_cvtepu8_epi16(tandem_gguf::k_scales_mins(blk + 4));
    const __m256i scales = _mm256_permute2x128_si256(sm, sm, 0x00);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i acc[MR];
    for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_si256();
    // Not unrolled: unrolled, the compiler decodes all four pairs ahead and spills the input
    // rows' accumulators (16 registers), which made 9 rows cost 13x one row.
#pragma GCC unroll 1
    for (int p = 0; p < 4; ++p) {
      const __m256i bytes = load256(blk + 16 + 32 * p);
      pair<MR>(_mm256_and_si256(bytes, m4), _mm256_and_si256(_mm256_srli_epi16(bytes, 4), m4), scales, p, in, b * 256, m0, acc);
    }
    finish<MR>(acc, _mm256_extracti128_si256(sm, 1), s, mins, stride);
  }
};

struct Q5K : Q4K {
  static constexpr int kBytes = 176;

  template <int MR>
  static void sums(const uint8_t* blk, const Inputs& in, int64_t b, int64_t m0, __m256i* s, __m128i* mins, int stride) {
    const __m256i sm = _mm256_cvtepu8_epi16(tandem_gguf::k_scales_mins(blk + 4));
    const __m256i scales = _mm256_permute2x128_si256(sm, sm, 0x00);
    const __m256i m4 = _mm256_set1_epi8(0x0F), m1 = _mm256_set1_epi8(1);
    const __m256i high = load256(blk + 16);  // bit j of byte l: the fifth bit of sub-block j's value l
    __m256i acc[MR];
    for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_si256();
#pragma GCC unroll 1  // as Q4K's
    for (int p = 0; p < 4; ++p) {
      const __m256i bytes = load256(blk + 48 + 32 * p);
      const __m256i hl = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(high, 2 * p), m1), 4);
      const __m256i hh = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(high, 2 * p + 1), m1), 4);
      const __m256i lo = _mm256_or_si256(_mm256_and_si256(bytes, m4), hl);
      const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bytes, 4), m4), hh);
      pair<MR>(lo, hi, scales, p, in, b * 256, m0, acc);
    }
    finish<MR>(acc, _mm256_extracti128_si256(sm, 1), s, mins, stride);
  }
};

struct Q6K {
  static constexpr int kValues = 256, kBytes = 210, kOffset = 0, kMins = 0, kHalves = 206;  // d at 208
  static constexpr bool kDHigh = true, kNegate = false, kWholeTile = false;

  template <int MR>
  static void sums(const uint8_t* blk, const Inputs& in, int64_t b, int64_t m0, __m256i* s, __m128i*, int stride) {
    const __m128i sc = load128(blk + 192);  // 16 int8 scales, one per 16 values
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
    __m256i acc[MR];
    for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i qa = load256(blk + 64 * h), qb = load256(blk + 64 * h + 32), qh = load256(blk + 128 + 32 * h);
      for (int t = 0; t < 4; ++t) {
        // Values 128h + 32t ..: low nibbles of qa/qb (t even/odd), high ones for t >= 2; bits 2t of qh.
        const __m256i low = _mm256_and_si256(t < 2 ? (t == 0 ? qa : qb) : _mm256_srli_epi16(t == 2 ? qa : qb, 4), m4);
        const __m256i top = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * t), m3), 4);
        const __m256i q6 = _mm256_or_si256(low, top);  // 0..63; the -32 comes after
        const int j = 8 * h + 2 * t;
        const __m256i scv = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, _mm_set_epi64x(0x0101010101010101LL * (j + 1), 0x0101010101010101LL * j)));
        for (int r = 0; r < MR; ++r) {
          const int8_t* x = in.row(m0 + r) + b * 256 + 128 * h + 32 * t;
          acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(q6, load256(x)), scv));
        }
      }
    }
    // S = sum_j sc_j * (codes . x)_j - 32 * sum_j sc_j * xs16_j.
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc);
    for (int r = 0; r < MR; ++r)
      s[r * stride] = _mm256_sub_epi32(acc[r], _mm256_slli_epi32(_mm256_madd_epi16(sc16, load256(in.sums16(m0 + r) + b * 16)), 5));
  }
};

// The legacy types: one block of 32, S = codes . x (the offset of Q4_0 / Q5_0 comes after).
template <int kBlockBytes, int kCodeOffset, int kMinsKind>
struct Legacy {
  static constexpr int kValues = 32, kBytes = kBlockBytes, kOffset = kCodeOffset, kMins = kMinsKind, kHalves = 0;
  static constexpr bool kDHigh = false, kNegate = false, kWholeTile = false;
};

template <class Codes, class Base>
struct LegacyOf : Base {
  template <int MR>
  static void sums(const uint8_t* blk, const Inputs& in, int64_t b, int64_t m0, __m256i* s, __m128i*, int stride) {
    const __m256i codes = Codes::get(blk);
    for (int r = 0; r < MR; ++r) s[r * stride] = dot32(codes, in.row(m0 + r) + b * 32);
  }
};

struct Q40Codes { static __m256i get(const uint8_t* blk) { return nibbles32(blk + 2); } };
struct Q41Codes { static __m256i get(const uint8_t* blk) { return nibbles32(blk + 4); } };
struct Q50Codes { static __m256i get(const uint8_t* blk) { return _mm256_or_si256(nibbles32(blk + 6), high_bits32(blk + 2)); } };
struct Q51Codes { static __m256i get(const uint8_t* blk) { return _mm256_or_si256(nibbles32(blk + 8), high_bits32(blk + 4)); } };

using Q40 = LegacyOf<Q40Codes, Legacy<18, 8, 0>>;
using Q41 = LegacyOf<Q41Codes, Legacy<20, 0, 2>>;
using Q50 = LegacyOf<Q50Codes, Legacy<22, 16, 0>>;
using Q51 = LegacyOf<Q51Codes, Legacy<24, 0, 2>>;

// Q8_0: signed codes; vpmaddubsw takes |w| and x with w's sign (|w| <= 128: no saturation).
struct Q80 : Legacy<34, 0, 0> {
  template <int MR>
  static void sums(const uint8_t* blk, const Inputs& in, int64_t b, int64_t m0, __m256i* s, __m128i*, int stride) {
    const __m256i w = load256(blk + 2), aw = _mm256_abs_epi8(w);
    for (int r = 0; r < MR; ++r) {
      const __m256i x = _mm256_sign_epi8(load256(in.row(m0 + r) + b * 32), w);
      s[r * stride] = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, x), _mm256_set1_epi16(1));
    }
  }
};

#include "gguf_tiles.h"  // run, dispatch

}  // namespace tandem_gguf_avx2

#include "gguf_rows8_avx2.h"

namespace tandem_gguf_avx2 {

inline bool packed_column(int64_t qtype, const Job& job, int64_t t, int64_t M) {
  switch (qtype) {
    case tandem_gguf::Q4_K: rows8::column<rows8::Q4K>(job, t, M); return true;
    case tandem_gguf::Q6_K: rows8::column<rows8::Q6K>(job, t, M); return true;
    default: return false;
  }
}

}  // namespace tandem_gguf_avx2
