// Q4_K with eight weight rows interleaved, for the AVX2 tiles (CPUs without AVX-512 VNNI).
//
// Why a second copy of the weights: on the file's layout the AVX2 Q4_K tile is bound by its
// arithmetic, not by memory (~12 GB/s a core against ~16-30 the memory gives): each 32 values of
// a weight row take two multiplies (vpmaddubsw, vpmaddwd) and a horizontal sum, and every row
// decodes its own scales. Laid out once at load as below (llama.cpp's repacked CPU layout works
// the same way), one register holds four rows' codes of one 32-value sub-block against the same
// eight inputs, four vpmaddubsw results add in 16 bits before one vpmaddwd applies the four rows'
// scales (1.25 multiplies per 32 values of a row), the codes are unpacked once for all input
// rows, the scales and mins are stored decoded and transposed, and a block ends in one horizontal
// sum for its 8 rows. Measured on one Zen 3 core: 2.4-2.6x the file layout's rate, one input row.
//
// The packed weight is [groups][blocks][kGroupBytes] (groups = ceil(N / 8); a last partial group
// padded with zero rows), per group and super-block of 256 values:
//   codes [8 sub-blocks][4 chunks][32 bytes]: byte q of chunk c of sub-block j holds value
//       32 j + 8 c + q % 8 of row q / 8 in its low nibble and of row 4 + q / 8 in its high one;
//   scales [8 sub-blocks][8 rows]; mins [4 pairs][8 rows][2] (row r's mins 2p, 2p + 1);
//   d [8 rows] fp16; dmin [8 rows] fp16.
// 1184 bytes for 8 x 144 of the file (103%).
//
// The integer sums are exact and the fp32 steps are gguf_tiles.h's (d * dx * S + (-dmin) * dx *
// Mn per block, in block order), so every output has the bits of the row layout and of
// reference.py, whatever the number of input rows.
#pragma once

namespace tandem_gguf_avx2 {

namespace q4k_rows8 {

constexpr int64_t kGroupBytes = 1024 + 64 + 64 + 16 + 16;
constexpr int64_t kScales = 1024, kMins = 1088, kD = 1152, kDmin = 1168;
constexpr int64_t kAhead = 4 * kGroupBytes;  // how far ahead of the block in use the tile prefetches

// One group (8 weight rows of the file from ``first``; rows past ``N`` are zero) -> its packed
// blocks at ``out``.
inline void pack_group(const uint8_t* W, int64_t row_bytes, int64_t N, int64_t first, int64_t blocks, uint8_t* out) {
  std::memset(out, 0, blocks * kGroupBytes);
  for (int r = 0; r < kRows && first + r < N; ++r) {
    const uint8_t* row = W + (first + r) * row_bytes;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* blk = row + b * 144;
      uint8_t* o = out + b * kGroupBytes;
      alignas(16) uint8_t sm[16];  // scales 0..7, mins 0..7
      uint8_t scale_bytes[16] = {0};
      std::memcpy(scale_bytes, blk + 4, 12);
      _mm_store_si128(reinterpret_cast<__m128i*>(sm), tandem_gguf::k_scales_mins(scale_bytes));
      for (int j = 0; j < 8; ++j) {
        o[kScales + 8 * j + r] = sm[j];
        o[kMins + 16 * (j / 2) + 2 * r + (j % 2)] = sm[8 + j];
      }
      std::memcpy(o + kD + 2 * r, blk, 2);
      std::memcpy(o + kDmin + 2 * r, blk + 2, 2);
      const uint8_t* qs = blk + 16;  // sub-block j's value i: qs[32 (j / 2) + i], high nibble for odd j
      const int shift = r < 4 ? 0 : 4;
      for (int j = 0; j < 8; ++j)
        for (int i = 0; i < 32; ++i) {
          const uint8_t code = (qs[32 * (j / 2) + i] >> (j % 2 ? 4 : 0)) & 0x0F;
          const int c = i / 8, q = 8 * (r % 4) + i % 8;
          o[(4 * j + c) * 32 + q] |= static_cast<uint8_t>(code << shift);
        }
    }
  }
}

// For input rows m0 .. m0+MR-1: the outputs of the group at ``g`` (the 8 weight rows from n0).
template <int MR>
inline void tile(const uint8_t* g, const Inputs& in, const float* bias_of_job, float* O, int64_t ldo, int64_t N, int64_t n0,
                 int64_t m0, bool prefetch) {
  const int64_t blocks = in.K / 256;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  // vpshufb masks: 64-bit lane l gets scale byte l (rows 0-3) or 4 + l (rows 4-7) as int16, four times.
  const __m256i lo_rows = _mm256_setr_epi8(0, -1, 0, -1, 0, -1, 0, -1, 1, -1, 1, -1, 1, -1, 1, -1,
                                           2, -1, 2, -1, 2, -1, 2, -1, 3, -1, 3, -1, 3, -1, 3, -1);
  const __m256i hi_rows = _mm256_setr_epi8(4, -1, 4, -1, 4, -1, 4, -1, 5, -1, 5, -1, 5, -1, 5, -1,
                                           6, -1, 6, -1, 6, -1, 6, -1, 7, -1, 7, -1, 7, -1, 7, -1);
  __m256 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* o = g + b * kGroupBytes;
    // The weights stream in order, but the hardware's prefetchers stop at each 4 KB page (a
    // group of the default target's rows spans two): fetch a few blocks ahead into L2.
    if (prefetch)
      for (int64_t l = 0; l < kGroupBytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(o) + kAhead + l, _MM_HINT_T1);
    // a0: [r0 r0 r1 r1 | r2 r2 r3 r3] (two int32 partial sums a row), a1 likewise rows 4-7.
    __m256i a0[MR], a1[MR];
    for (int r = 0; r < MR; ++r) a0[r] = a1[r] = _mm256_setzero_si256();
#pragma GCC unroll 1
    for (int j = 0; j < 8; ++j) {
      __m256i w0[4], w1[4];
      for (int c = 0; c < 4; ++c) {
        const __m256i bytes = load256(o + (4 * j + c) * 32);
        w0[c] = _mm256_and_si256(bytes, m4);
        w1[c] = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), m4);
      }
      int64_t scale8;
      std::memcpy(&scale8, o + kScales + 8 * j, 8);
      const __m256i sb = _mm256_set1_epi64x(scale8);
      const __m256i s0 = _mm256_shuffle_epi8(sb, lo_rows), s1 = _mm256_shuffle_epi8(sb, hi_rows);
      for (int r = 0; r < MR; ++r) {
        const int8_t* x = in.row(m0 + r) + b * 256 + 32 * j;
        // Four products of at most 2 * 15 * 127 per 16-bit lane: at most 15,240, exact in int16.
        __m256i p0, p1;
        for (int c = 0; c < 4; ++c) {
          int64_t x8;
          std::memcpy(&x8, x + 8 * c, 8);
          const __m256i xv = _mm256_set1_epi64x(x8);
          const __m256i q0 = _mm256_maddubs_epi16(w0[c], xv), q1 = _mm256_maddubs_epi16(w1[c], xv);
          p0 = c == 0 ? q0 : _mm256_add_epi16(p0, q0);
          p1 = c == 0 ? q1 : _mm256_add_epi16(p1, q1);
        }
        a0[r] = _mm256_add_epi32(a0[r], _mm256_madd_epi16(p0, s0));
        a1[r] = _mm256_add_epi32(a1[r], _mm256_madd_epi16(p1, s1));
      }
    }
    const __m256 dv = _mm256_cvtph_ps(load128(o + kD));
    const __m256 ov = _mm256_xor_ps(_mm256_cvtph_ps(load128(o + kDmin)), _mm256_set1_ps(-0.0f));  // -dmin
    __m256i wm[4];
    for (int p = 0; p < 4; ++p) wm[p] = _mm256_cvtepu8_epi16(load128(o + kMins + 16 * p));
    for (int r = 0; r < MR; ++r) {
      // hadd: [r0 r1 r4 r5 | r2 r3 r6 r7] -> rows in order.
      const __m256i S = _mm256_permute4x64_epi64(_mm256_hadd_epi32(a0[r], a1[r]), 0xD8);
      const __m256i Mn = mins_dot(wm, in.sums32(m0 + r) + b * 8);
      const __m256 dxv = _mm256_set1_ps(in.scale(m0 + r, b));
      __m256 t = _mm256_mul_ps(_mm256_mul_ps(dv, dxv), _mm256_cvtepi32_ps(S));
      t = _mm256_add_ps(t, _mm256_mul_ps(_mm256_mul_ps(ov, dxv), _mm256_cvtepi32_ps(Mn)));
      acc[r] = _mm256_add_ps(acc[r], t);
    }
  }
  const int64_t valid = std::min<int64_t>(kRows, N - n0);
  alignas(32) float bias[kRows] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (bias_of_job)
    for (int64_t i = 0; i < valid; ++i) bias[i] = bias_of_job[n0 + i];
  for (int r = 0; r < MR; ++r) {
    const __m256 y = bias_of_job ? _mm256_add_ps(acc[r], _mm256_load_ps(bias)) : acc[r];
    float* out = O + (m0 + r) * ldo + n0;
    if (valid == kRows) {
      _mm256_storeu_ps(out, y);
    } else {
      alignas(32) float lanes[kRows];
      _mm256_store_ps(lanes, y);
      for (int64_t i = 0; i < valid; ++i) out[i] = lanes[i];
    }
  }
}

template <int MR = kMaxRows>
inline void tile_rows(int64_t count, const uint8_t* g, const Job& job, int64_t n0, int64_t m0, bool prefetch) {
  if constexpr (MR > 1) {
    if (count < MR) return tile_rows<MR - 1>(count, g, job, n0, m0, prefetch);
  }
  tile<MR>(g, *job.in, job.B, job.O, job.ldo, job.N, n0, m0, prefetch);
}

// Group t of ``job`` (its weight rows 8t .. 8t+7, packed at job.P) against all M input rows,
// chunked as gguf_tiles.h's ``column``.
inline void column(const Job& job, int64_t t, int64_t M) {
  const int64_t blocks = job.in->K / 256;
  const uint8_t* g = job.P + t * blocks * kGroupBytes;
  const int64_t chunks = (M + kMaxRows - 1) / kMaxRows;
  int64_t m = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t count = M / chunks + (c < M % chunks ? 1 : 0);
    tile_rows(count, g, job, t * kRows, m, c == 0);  // later chunks find the group in L1 / L2
    m += count;
  }
}

}  // namespace q4k_rows8

}  // namespace tandem_gguf_avx2
