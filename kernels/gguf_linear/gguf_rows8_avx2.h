// Q4_K and Q6_K with eight weight rows interleaved, for the AVX2 tiles (CPUs without AVX-512 VNNI).
//
// Why a second copy of the weights: on the file's layout the AVX2 K-quant tiles are bound by
// their arithmetic, not by memory (Q4_K ~12 GB/s a core against ~17-30 the memory gives): each 32
// values of a weight row take two multiplies (vpmaddubsw, vpmaddwd) and a horizontal sum, and
// every row decodes its own scales. Laid out once at load as below (llama.cpp's repacked CPU
// layout works the same way), one register holds four rows' codes of one sub-block against the
// same eight inputs, vpmaddubsw results add in 16 bits before one vpmaddwd applies the four rows'
// scales, the codes are unpacked once for all input rows, the scales sit transposed, and a block
// ends in one horizontal sum for its 8 rows. Measured on one Zen 3 core: Q4_K 2.4x the file
// layout's rate at one input row.
//
// A packed weight is [groups][blocks][F::kGroupBytes] (groups = ceil(N / 8); a last partial group
// padded with zero rows). In both formats, byte q of a 32-byte "chunk" of codes holds value
// 8 c + q % 8 of a sub-block (c: the chunk's place in it) of row q / 8 in its low nibble and of
// row 4 + q / 8 in its high one.
//
// Q4_K, per group and super-block of 256 values (1184 bytes for 8 x 144 of the file, 103%):
//   codes [8 sub-blocks of 32][4 chunks][32 bytes]; scales [8 sub-blocks][8 rows];
//   mins [4 pairs][8 rows][2] (row r's mins 2p, 2p + 1); d [8 rows] fp16; dmin [8 rows] fp16.
// Q6_K (1680 bytes for 8 x 210, 100%):
//   low nibbles [16 sub-blocks of 16][2 chunks][32 bytes]; high bits [16 sub-blocks][32 bytes]
//   (byte q: bits 0-1 chunk 0's low-nibble row, 2-3 its high-nibble row, 4-5 and 6-7 chunk 1's);
//   scales [8 pairs][8 rows][2] int8 (row r's scales 2p, 2p + 1); d [8 rows] fp16.
//
// The integer sums are exact and the fp32 steps are gguf_tiles.h's (d * dx * S (+ (-dmin) * dx *
// Mn) per block, in block order), so every output has the bits of the row layout and of
// reference.py, whatever the number of input rows.
#pragma once

namespace tandem_gguf_avx2 {

namespace rows8 {

// vpshufb masks: 64-bit lane l gets byte l (``rows_low``) or 4 + l (``rows_high``) of each
// 128-bit lane as an int16, four times (Q4_K's unsigned scales).
inline __m256i rows_low() {
  return _mm256_setr_epi8(0, -1, 0, -1, 0, -1, 0, -1, 1, -1, 1, -1, 1, -1, 1, -1, 2, -1, 2, -1, 2, -1, 2, -1, 3, -1, 3, -1, 3, -1, 3, -1);
}
inline __m256i rows_high() { return _mm256_add_epi8(rows_low(), _mm256_setr_epi8(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0,
                                                                                 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0)); }

constexpr uint64_t kNibbles = 0x0F0F0F0F0F0F0F0FULL;

inline uint64_t load8(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// *p |= v, 8 bytes.
inline void or8(uint8_t* p, uint64_t v) {
  const uint64_t was = load8(p) | v;
  std::memcpy(p, &was, 8);
}

inline __m256i broadcast8(const int8_t* x) {
  int64_t v;
  std::memcpy(&v, x, 8);
  return _mm256_set1_epi64x(v);
}

// [r0 r0 r1 r1 | r2 r2 r3 r3] and the same for rows 4-7 -> the 8 rows' sums in order (exact).
inline __m256i rows_in_order(__m256i a0, __m256i a1) { return _mm256_permute4x64_epi64(_mm256_hadd_epi32(a0, a1), 0xD8); }

struct Q4K {
  static constexpr int64_t kFileBytes = 144, kGroupBytes = 1024 + 64 + 64 + 16 + 16;
  static constexpr int64_t kScales = 1024, kMins = 1088, kD = 1152, kDmin = 1168;
  static constexpr bool kHasMins = true;

  static void pack_row(const uint8_t* blk, int r, uint8_t* o) {
    uint8_t sm[16];  // scales 0..7, mins 0..7
    tandem_gguf::k_scales_mins_of(blk, sm);
    for (int j = 0; j < 8; ++j) {
      o[kScales + 8 * j + r] = sm[j];
      o[kMins + 16 * (j / 2) + 2 * r + (j % 2)] = sm[8 + j];
    }
    std::memcpy(o + kD + 2 * r, blk, 2);
    std::memcpy(o + kDmin + 2 * r, blk + 2, 2);
    const uint8_t* qs = blk + 16;  // sub-block j's value i: qs[32 (j / 2) + i], high nibble for odd j
    for (int j = 0; j < 8; ++j)
      for (int c = 0; c < 4; ++c) {  // 8 values at once, a byte each (shifts never carry across bytes once masked)
        const uint64_t codes = (load8(qs + 32 * (j / 2) + 8 * c) >> (j % 2 ? 4 : 0)) & kNibbles;
        or8(o + (4 * j + c) * 32 + 8 * (r % 4), r < 4 ? codes : codes << 4);
      }
  }

  // S (and Mn) of the block at ``o`` for input rows m0 .. m0+MR-1, the 8 weight rows in order.
  template <int MR>
  static void sums(const uint8_t* o, const Inputs& in, int64_t b, int64_t m0, __m256i* S, __m256i* Mn) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), lo_rows = rows_low(), hi_rows = rows_high();
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
          const __m256i xv = broadcast8(x + 8 * c);
          const __m256i q0 = _mm256_maddubs_epi16(w0[c], xv), q1 = _mm256_maddubs_epi16(w1[c], xv);
          p0 = c == 0 ? q0 : _mm256_add_epi16(p0, q0);
          p1 = c == 0 ? q1 : _mm256_add_epi16(p1, q1);
        }
        a0[r] = _mm256_add_epi32(a0[r], _mm256_madd_epi16(p0, s0));
        a1[r] = _mm256_add_epi32(a1[r], _mm256_madd_epi16(p1, s1));
      }
    }
    __m256i wm[4];
    for (int p = 0; p < 4; ++p) wm[p] = _mm256_cvtepu8_epi16(load128(o + kMins + 16 * p));
    for (int r = 0; r < MR; ++r) {
      S[r] = rows_in_order(a0[r], a1[r]);
      Mn[r] = mins_dot(wm, in.sums32(m0 + r) + b * 8);
    }
  }
};

struct Q6K {
  static constexpr int64_t kFileBytes = 210, kGroupBytes = 1024 + 512 + 128 + 16;
  static constexpr int64_t kHigh = 1024, kScales = 1536, kD = 1664, kDmin = 0;
  static constexpr bool kHasMins = false;

  static void pack_row(const uint8_t* blk, int r, uint8_t* o) {
    const uint8_t *ql = blk, *qh = blk + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
    for (int j = 0; j < 16; ++j) o[kScales + 16 * (j / 2) + 2 * r + (j % 2)] = static_cast<uint8_t>(sc[j]);
    std::memcpy(o + kD + 2 * r, blk + 208, 2);
    for (int v = 0; v < 256; v += 8) {  // 8 values at once, a byte each
      // blocks.py's Q6_K: value v = 128 h + 32 t + l (t < 4) has its low 4 bits in ql[64 h + l
      // (+ 32 for odd t)], high nibble for t >= 2, and its top 2 bits at 2 t of qh[32 h + l].
      const int h = v / 128, t = (v % 128) / 32, l = v % 32;
      const uint64_t low = (load8(ql + 64 * h + l + (t % 2) * 32) >> (t >= 2 ? 4 : 0)) & kNibbles;
      const uint64_t top = (load8(qh + 32 * h + l) >> (2 * t)) & 0x0303030303030303ULL;
      const int j = v / 16, c = (v % 16) / 8, q = 8 * (r % 4);
      or8(o + (2 * j + c) * 32 + q, r < 4 ? low : low << 4);
      or8(o + kHigh + 32 * j + q, top << (4 * c + (r < 4 ? 0 : 2)));
    }
  }

  template <int MR>
  static void sums(const uint8_t* o, const Inputs& in, int64_t b, int64_t m0, __m256i* S, __m256i*) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    // vpshufb masks over [scales 2p, 2p + 1 of rows 0-3 | the same] (int16): 64-bit lane l gets
    // row l's (``even``) or row 2 + l's scale, four times; one for each of the pair.
    const __m256i even = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 4, 5, 4, 5, 4, 5, 4, 5, 8, 9, 8, 9, 8, 9, 8, 9, 12, 13, 12, 13, 12, 13, 12, 13);
    const __m256i odd = _mm256_add_epi8(even, _mm256_set1_epi8(2));
    __m256i a0[MR], a1[MR];
    for (int r = 0; r < MR; ++r) a0[r] = a1[r] = _mm256_setzero_si256();
    __m256i wsc[8];
#pragma GCC unroll 1
    for (int p = 0; p < 8; ++p) {
      // Row r's scales 2p, 2p + 1 as int16: rows 0-3 in the low 128 bits, 4-7 in the high.
      wsc[p] = _mm256_cvtepi8_epi16(load128(o + kScales + 16 * p));
      const __m256i lo = _mm256_permute4x64_epi64(wsc[p], 0x44), hi = _mm256_permute4x64_epi64(wsc[p], 0xEE);
      for (int e = 0; e < 2; ++e) {
        const int j = 2 * p + e;
        const __m256i s0 = _mm256_shuffle_epi8(lo, e ? odd : even), s1 = _mm256_shuffle_epi8(hi, e ? odd : even);
        const __m256i n0 = load256(o + (2 * j) * 32), n1 = load256(o + (2 * j + 1) * 32), h = load256(o + kHigh + 32 * j);
        const __m256i w00 = _mm256_or_si256(_mm256_and_si256(n0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30));
        const __m256i w10 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n0, 4), m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30));
        const __m256i w01 = _mm256_or_si256(_mm256_and_si256(n1, m4), _mm256_and_si256(h, m30));
        const __m256i w11 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(h, 2), m30));
        for (int r = 0; r < MR; ++r) {
          const int8_t* x = in.row(m0 + r) + b * 256 + 16 * j;
          const __m256i x0 = broadcast8(x), x1 = broadcast8(x + 8);
          // Two products of at most 2 * 63 * 127 per 16-bit lane: at most 32,004, exact in int16.
          const __m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(w00, x0), _mm256_maddubs_epi16(w01, x1));
          const __m256i p1 = _mm256_add_epi16(_mm256_maddubs_epi16(w10, x0), _mm256_maddubs_epi16(w11, x1));
          a0[r] = _mm256_add_epi32(a0[r], _mm256_madd_epi16(p0, s0));
          a1[r] = _mm256_add_epi32(a1[r], _mm256_madd_epi16(p1, s1));
        }
      }
    }
    // The codes' -32: S -= 32 * sum_j sc_j * xs16_j, for the 8 rows at once.
    for (int r = 0; r < MR; ++r) {
      const int16_t* xs = in.sums16(m0 + r) + b * 16;
      int32_t pairs[8];
      std::memcpy(pairs, xs, 32);
      __m256i off = _mm256_madd_epi16(wsc[0], _mm256_set1_epi32(pairs[0]));
      for (int p = 1; p < 8; ++p) off = _mm256_add_epi32(off, _mm256_madd_epi16(wsc[p], _mm256_set1_epi32(pairs[p])));
      S[r] = _mm256_sub_epi32(rows_in_order(a0[r], a1[r]), _mm256_slli_epi32(off, 5));
    }
  }
};

// One group (8 weight rows of the file from ``first``; rows past ``N`` are zero) -> its packed
// blocks at ``out``.
template <class F>
inline void pack_group(const uint8_t* W, int64_t row_bytes, int64_t N, int64_t first, int64_t blocks, uint8_t* out) {
  std::memset(out, 0, blocks * F::kGroupBytes);
  for (int r = 0; r < kRows && first + r < N; ++r)
    for (int64_t b = 0; b < blocks; ++b) F::pack_row(W + (first + r) * row_bytes + b * F::kFileBytes, r, out + b * F::kGroupBytes);
}

// For input rows m0 .. m0+MR-1: the outputs of the group at ``g`` (the 8 weight rows from n0).
template <class F, int MR>
inline void tile(const uint8_t* g, const Job& job, int64_t n0, int64_t m0, bool prefetch) {
  const Inputs& in = *job.in;
  const int64_t blocks = in.K / 256;
  // The weights stream in order, but the hardware's prefetchers stop at each 4 KB page (where
  // 2 MB pages were not granted): fetch a few blocks ahead into L2.
  constexpr int64_t kAhead = 4 * F::kGroupBytes;
  __m256 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* o = g + b * F::kGroupBytes;
    if (prefetch)
      for (int64_t l = 0; l < F::kGroupBytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(o) + kAhead + l, _MM_HINT_T1);
    __m256i S[MR], Mn[MR];
    F::template sums<MR>(o, in, b, m0, S, Mn);
    const __m256 dv = _mm256_cvtph_ps(load128(o + F::kD));
    for (int r = 0; r < MR; ++r) {
      const __m256 dxv = _mm256_set1_ps(in.scale(m0 + r, b));
      __m256 t = _mm256_mul_ps(_mm256_mul_ps(dv, dxv), _mm256_cvtepi32_ps(S[r]));
      if constexpr (F::kHasMins) {
        const __m256 ov = _mm256_xor_ps(_mm256_cvtph_ps(load128(o + F::kDmin)), _mm256_set1_ps(-0.0f));  // -dmin
        t = _mm256_add_ps(t, _mm256_mul_ps(_mm256_mul_ps(ov, dxv), _mm256_cvtepi32_ps(Mn[r])));
      }
      acc[r] = _mm256_add_ps(acc[r], t);
    }
  }
  store_tile<MR>(acc, job, n0, m0);
}

template <class F, int MR = kMaxRows>
inline void tile_rows(int64_t count, const uint8_t* g, const Job& job, int64_t n0, int64_t m0, bool prefetch) {
  if constexpr (MR > 1) {
    if (count < MR) return tile_rows<F, MR - 1>(count, g, job, n0, m0, prefetch);
  }
  tile<F, MR>(g, job, n0, m0, prefetch);
}

// Group t of ``job`` (its weight rows 8t .. 8t+7, packed at job.P) against all M input rows,
// chunked as gguf_tiles.h's ``column``.
template <class F>
inline void column(const Job& job, int64_t t, int64_t M) {
  const uint8_t* g = job.P + t * (job.in->K / 256) * F::kGroupBytes;
  const int64_t chunks = (M + kMaxRows - 1) / kMaxRows;
  int64_t m = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t count = M / chunks + (c < M % chunks ? 1 : 0);
    tile_rows<F>(count, g, job, t * kRows, m, c == 0);  // later chunks find the group in L1 / L2
    m += count;
  }
}

// The packed bytes of a group's super-block for ``qtype``; 0 for a type not packed.
inline int64_t group_bytes(int64_t qtype) {
  return qtype == tandem_gguf::Q4_K ? Q4K::kGroupBytes : qtype == tandem_gguf::Q6_K ? Q6K::kGroupBytes : 0;
}

}  // namespace rows8

}  // namespace tandem_gguf_avx2
