// Q4_K and Q6_K laid out once at load in groups of 16 weight rows, for the AVX-512 VNNI tiles
// (CPUs with VNNI and without AMX): the layout the prefill tiles (gguf_prefill_vnni.h) build per
// call, kept in 4-bit codes (Q6_K's top bits apart), so that every row count computes on it.
//
// Why: on the file's layout each (input row, weight row) pair's products sit in 16 int32 lanes
// that must be summed across lanes per block, after two multiplies per 64 codes that apply the
// sub-block scales (vpackssdw + vpdpwssd), and every block unpacks its rows' scales and gathers
// their d: on a Zen 4 core those tiles were bound by that arithmetic from the second input row
// on (Q4_K gate/up: 1 row 0.29 ms, 5 rows 0.64), so each verified row cost ~6 ms of the default
// target's step. Here one vector holds 4 consecutive codes of each of the 16 rows: vpdpbusd
// against 4 input values broadcast gives each lane one row's sum (no lane reduction), one
// vpmulld a sub-block applies 16 rows' scales, and the scales, mins and d sit transposed (5 rows
// 0.33 ms). Up to kRowsAtOnce input rows take the codes from registers, more from the prefill
// tiles' BlockTile unpacked once per block.
//
// Q4_K per group and super-block (2,368 bytes against 16 x 144 in the file, 103%):
//   codes [8 sub-blocks][4][64 bytes]: byte 4i + k of vector q of sub-block j holds row i's
//     value 32j + 4q + k in its low nibble and value 32j + 16 + 4q + k in its high one;
//   scales [8][16] (sub-block j, row i); mins [4][16][2] (row i's mins 2k, 2k + 1);
//   d [16] fp16; dmin [16] fp16.
// Q6_K: see rows16::Q6K. A last partial group is padded with zero rows. The exact integers S
// (and Mn) per block and the fp32 step of block_rows (gguf_prefill_vnni.h) in block order: the
// bits of every other tile and of reference.py, whatever the number of input rows.
#pragma once

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c")

namespace tandem_gguf_vnni {

namespace rows16 {

inline __m512i load64(const uint8_t* p) { return _mm512_load_si512(p); }
inline __m512 halves16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p))); }

inline uint32_t load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline void or32(uint8_t* p, uint32_t v) {
  const uint32_t was = load32(p) | v;
  std::memcpy(p, &was, 4);
}

struct Q4K {
  static constexpr bool kQ6 = false;
  static constexpr int64_t kFileBytes = 144, kScales = 2048, kMins = 2176, kD = 2304, kDmin = 2336, kGroupBytes = 2368;

  // Row i (of 16) of a group: the file's block ``blk`` -> its bytes of the packed block ``o``
  // (zeroed before).
  static void pack_row(const uint8_t* blk, int i, uint8_t* o) {
    uint8_t sm[16];  // scales 0..7, mins 0..7
    tandem_gguf::k_scales_mins_of(blk, sm);
    for (int j = 0; j < 8; ++j) {
      o[kScales + 16 * j + i] = sm[j];
      o[kMins + 32 * (j / 2) + 2 * i + (j % 2)] = sm[8 + j];
    }
    std::memcpy(o + kD + 2 * i, blk, 2);
    std::memcpy(o + kDmin + 2 * i, blk + 2, 2);
    const uint8_t* qs = blk + 16;  // sub-block j's value l: qs[32 (j / 2) + l], high nibble for odd j
    for (int j = 0; j < 8; ++j) {
      const int shift = 4 * (j % 2);
      for (int q = 0; q < 4; ++q) {  // 4 values a word, a byte each (shifts never carry across bytes once masked)
        const uint32_t low = (load32(qs + 32 * (j / 2) + 4 * q) >> shift) & 0x0F0F0F0Fu;
        const uint32_t high = (load32(qs + 32 * (j / 2) + 16 + 4 * q) >> shift) & 0x0F0F0F0Fu;
        or32(o + (4 * j + q) * 64 + 4 * i, low | (high << 4));
      }
    }
  }

  // The packed block ``o`` -> the prefill tiles' BlockTile.
  static void unpack(const uint8_t* o, BlockTile& t) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int j = 0; j < 8; ++j)
      for (int q = 0; q < 4; ++q) {
        const __m512i v = load64(o + (4 * j + q) * 64);
        _mm512_store_si512(t.codes[8 * j + q], _mm512_and_si512(v, m4));
        _mm512_store_si512(t.codes[8 * j + 4 + q], _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
      }
    for (int j = 0; j < 8; ++j)
      _mm512_store_si512(t.scale[j], _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(o + kScales + 16 * j))));
    for (int k = 0; k < 4; ++k)
      _mm512_store_si512(t.min_pairs[k], _mm512_cvtepu8_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(o + kMins + 32 * k))));
    _mm512_store_ps(t.d, halves16(o + kD));
    _mm512_store_ps(t.o, _mm512_xor_ps(halves16(o + kDmin), _mm512_set1_ps(-0.0f)));  // -dmin, as the tiles of 8 negate it
  }

  // S = sum_j sc_j * (codes . x)_j for input rows m0 .. m0+R-1 (exact), from the packed vectors.
  template <int R>
  static void sums(const uint8_t* o, const Inputs& in, int64_t b, int64_t m0, __m512i* S) {
    const int8_t* x[R];
    for (int r = 0; r < R; ++r) x[r] = in.row(m0 + r) + b * 256;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    // Few rows: the low and high nibbles' products in chains of their own (exact integers, so in
    // any order), or one row's sub-block would wait on 8 dependent vpdpbusd.
    constexpr int C = R <= 2 ? 2 : 1;
    for (int j = 0; j < 8; ++j) {
      __m512i dot[R][C];
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) dot[r][c] = _mm512_setzero_si512();
      for (int q = 0; q < 4; ++q) {
        const __m512i v = load64(o + (4 * j + q) * 64);
        const __m512i low = _mm512_and_si512(v, m4), high = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        for (int r = 0; r < R; ++r) {
          dot[r][0] = _mm512_dpbusd_epi32(dot[r][0], low, _mm512_set1_epi32(load_i32(x[r] + 32 * j + 4 * q)));
          dot[r][C - 1] = _mm512_dpbusd_epi32(dot[r][C - 1], high, _mm512_set1_epi32(load_i32(x[r] + 32 * j + 16 + 4 * q)));
        }
      }
      const __m512i sc = _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(o + kScales + 16 * j)));
      for (int r = 0; r < R; ++r) {
        const __m512i d = C == 2 ? _mm512_add_epi32(dot[r][0], dot[r][C - 1]) : dot[r][0];
        S[r] = _mm512_add_epi32(S[r], _mm512_mullo_epi32(d, sc));
      }
    }
  }

  // The fp32 step of block_rows (gguf_prefill_vnni.h) for input row m: d * dx * S + (-dmin) * dx * Mn.
  static __m512 step(const uint8_t* o, const Inputs& in, int64_t b, int64_t m, __m512i S) {
    const __m512 dxv = _mm512_set1_ps(in.scale(m, b));
    const __m512 s = _mm512_mul_ps(_mm512_mul_ps(halves16(o + kD), dxv), _mm512_cvtepi32_ps(S));
    const int16_t* xs = in.sums32(m) + b * 8;
    __m512i mn = _mm512_setzero_si512();
    for (int k = 0; k < 4; ++k)
      mn = _mm512_dpwssd_epi32(mn, _mm512_cvtepu8_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(o + kMins + 32 * k))),
                               _mm512_set1_epi32(load_i32(xs + 2 * k)));
    const __m512 ov = _mm512_xor_ps(halves16(o + kDmin), _mm512_set1_ps(-0.0f));
    return _mm512_add_ps(s, _mm512_mul_ps(_mm512_mul_ps(ov, dxv), _mm512_cvtepi32_ps(mn)));
  }
};

// Q6_K per group and super-block (3,392 bytes against 16 x 210 in the file, 101%): for each pair
// P of sub-blocks (2P, 2P + 1: 4-code groups 8P .. 8P + 7), 4 vectors of low nibbles (byte 4i + k
// of vector q: row i's code 4 (8P + q) + k in its low nibble, 4 (8P + 4 + q) + k in its high one)
// and 2 of top bits (vector e: the top 2 bits of group 8P + 4e + c at bits 2c); then scales
// [16][16] int8; d [16] fp16.
struct Q6K {
  static constexpr bool kQ6 = true;
  static constexpr int64_t kFileBytes = 210, kPairBytes = 384, kScales = 3072, kD = 3328, kGroupBytes = 3392;

  static void pack_row(const uint8_t* blk, int i, uint8_t* o) {
    const uint8_t *ql = blk, *qh = blk + 128;
    for (int j = 0; j < 16; ++j) o[kScales + 16 * j + i] = blk[192 + j];
    std::memcpy(o + kD + 2 * i, blk + 208, 2);
    for (int g = 0; g < 64; ++g) {  // group g: values 4g .. 4g+3 = 128 h + 32 t + l .. l+3
      const int v = 4 * g, h = v / 128, t = (v % 128) / 32, l = v % 32;
      const uint32_t low = (load32(ql + 64 * h + l + 32 * (t % 2)) >> (t >= 2 ? 4 : 0)) & 0x0F0F0F0Fu;
      const uint32_t top = (load32(qh + 32 * h + l) >> (2 * t)) & 0x03030303u;
      const int P = g / 8, q = g % 8;
      or32(o + P * kPairBytes + (q % 4) * 64 + 4 * i, q < 4 ? low : low << 4);
      or32(o + P * kPairBytes + 256 + (q / 4) * 64 + 4 * i, top << (2 * (q % 4)));
    }
  }

  // Group 8P + q's codes (0..63) from pair P's vectors.
  static __m512i codes(const uint8_t* o, int P, int q) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(3);
    const __m512i n = load64(o + P * kPairBytes + (q % 4) * 64), top = load64(o + P * kPairBytes + 256 + (q / 4) * 64);
    const __m512i low = q < 4 ? _mm512_and_si512(n, m4) : _mm512_and_si512(_mm512_srli_epi16(n, 4), m4);
    const __m512i bits = _mm512_and_si512(_mm512_srli_epi16(top, 2 * (q % 4)), m3);
    return _mm512_or_si512(low, _mm512_slli_epi16(bits, 4));
  }

  static void unpack(const uint8_t* o, BlockTile& t) {
    for (int P = 0; P < 8; ++P)
      for (int q = 0; q < 8; ++q) _mm512_store_si512(t.codes[8 * P + q], codes(o, P, q));
    for (int j = 0; j < 16; ++j)  // signed bytes
      _mm512_store_si512(t.scale[j], _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(o + kScales + 16 * j))));
    _mm512_store_ps(t.d, halves16(o + kD));
  }

  // S = sum_j sc_j * ((codes . x)_j - 32 * xs16_j) (exact), as block_rows computes it.
  template <int R>
  static void sums(const uint8_t* o, const Inputs& in, int64_t b, int64_t m0, __m512i* S) {
    const int8_t* x[R];
    for (int r = 0; r < R; ++r) x[r] = in.row(m0 + r) + b * 256;
    for (int P = 0; P < 8; ++P) {
      __m512i w[8];
      for (int q = 0; q < 8; ++q) w[q] = codes(o, P, q);
      for (int e = 0; e < 2; ++e) {  // sub-block j = 2P + e: groups 8P + 4e .. 8P + 4e + 3
        const int j = 2 * P + e;
        const __m512i sc = _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(o + kScales + 16 * j)));
        for (int r = 0; r < R; ++r) {
          __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();
          d0 = _mm512_dpbusd_epi32(d0, w[4 * e], _mm512_set1_epi32(load_i32(x[r] + 16 * j)));
          d1 = _mm512_dpbusd_epi32(d1, w[4 * e + 1], _mm512_set1_epi32(load_i32(x[r] + 16 * j + 4)));
          d0 = _mm512_dpbusd_epi32(d0, w[4 * e + 2], _mm512_set1_epi32(load_i32(x[r] + 16 * j + 8)));
          d1 = _mm512_dpbusd_epi32(d1, w[4 * e + 3], _mm512_set1_epi32(load_i32(x[r] + 16 * j + 12)));
          const __m512i dot = _mm512_sub_epi32(_mm512_add_epi32(d0, d1), _mm512_set1_epi32(32 * in.sums16(m0 + r)[b * 16 + j]));
          S[r] = _mm512_add_epi32(S[r], _mm512_mullo_epi32(dot, sc));
        }
      }
    }
  }

  static __m512 step(const uint8_t* o, const Inputs& in, int64_t b, int64_t m, __m512i S) {
    return _mm512_mul_ps(_mm512_mul_ps(halves16(o + kD), _mm512_set1_ps(in.scale(m, b))), _mm512_cvtepi32_ps(S));
  }
};

// The 16 weight rows from ``first`` (those below N; the rest zero) -> their packed blocks at ``out``.
template <class F>
inline void pack_group(const uint8_t* W, int64_t row_bytes, int64_t N, int64_t first, int64_t blocks, uint8_t* out) {
  std::memset(out, 0, blocks * F::kGroupBytes);
  for (int i = 0; i < kWide && first + i < N; ++i)
    for (int64_t b = 0; b < blocks; ++b) F::pack_row(W + (first + i) * row_bytes + b * F::kFileBytes, i, out + b * F::kGroupBytes);
}

// Input rows m0 .. m0+R-1 against the packed block ``o`` (block b): the exact integers, then the
// fp32 step of block_rows into acc (16 lanes per row).
template <class F, int R>
inline void block_rows(const uint8_t* o, const Inputs& in, int64_t b, int64_t m0, float* acc) {
  __m512i S[R];
  for (int r = 0; r < R; ++r) S[r] = _mm512_setzero_si512();
  F::template sums<R>(o, in, b, m0, S);
  for (int r = 0; r < R; ++r) {
    float* a = acc + (m0 + r) * kWide;
    _mm512_store_ps(a, _mm512_add_ps(_mm512_load_ps(a), F::step(o, in, b, m0 + r, S[r])));
  }
}

constexpr int64_t kNear = 2, kFar = 8;  // blocks ahead that the tiles fetch into L2 (see tile)

// Group t (weight rows 16t .. 16t+15, packed at job.P) against all M input rows: up to
// kRowsAtOnce from the packed vectors in registers; more through ``bt`` and the prefill tiles'
// block_rows (the same integers and fp32 steps): unpacking each vector once and loading it per 6
// rows costs less than unpacking it per 6 rows.
template <class F>
inline void tile(const Job& job, int64_t t, int64_t M, BlockTile& bt, float* acc) {
  const int64_t blocks = job.in->K / 256;
  const uint8_t* g = job.P + t * blocks * F::kGroupBytes;
  const uint8_t* end = job.P + ((job.N + kWide - 1) / kWide) * blocks * F::kGroupBytes;
  std::fill(acc, acc + M * kWide, 0.0f);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* o = g + b * F::kGroupBytes;
    // The groups stream in order, one stream a thread, which the hardware's prefetchers alone
    // keep too few lines in flight for (and they stop at each 4 KB page where 2 MB pages were
    // not granted): fetch into L2 two blocks ahead and eight ahead (the next group's first ones
    // near the end), two streams' worth of misses. Measured on a Zen 4 (one input row, the
    // down projection's 35 blocks a group): two ahead alone 5-13% slower than the file layout's
    // tiles of 8, whose eight rows are eight streams; with eight ahead too, level or faster.
    for (const int64_t distance : {kNear, kFar}) {
      const uint8_t* ahead = o + distance * F::kGroupBytes;
      if (ahead < end)
        for (int64_t l = 0; l < F::kGroupBytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(ahead) + l, _MM_HINT_T1);
    }
    if (M > kRowsAtOnce) {
      F::unpack(o, bt);
      int64_t m = 0;
      for (; m + kRowsAtOnce <= M; m += kRowsAtOnce) tandem_gguf_vnni::block_rows<F::kQ6, kRowsAtOnce>(bt, *job.in, b, m, acc);
      switch (M - m) {
        case 5: tandem_gguf_vnni::block_rows<F::kQ6, 5>(bt, *job.in, b, m, acc); break;
        case 4: tandem_gguf_vnni::block_rows<F::kQ6, 4>(bt, *job.in, b, m, acc); break;
        case 3: tandem_gguf_vnni::block_rows<F::kQ6, 3>(bt, *job.in, b, m, acc); break;
        case 2: tandem_gguf_vnni::block_rows<F::kQ6, 2>(bt, *job.in, b, m, acc); break;
        case 1: tandem_gguf_vnni::block_rows<F::kQ6, 1>(bt, *job.in, b, m, acc); break;
        default: break;
      }
      continue;
    }
    switch (M) {  // all of them in one go: each packed vector loaded once for all
      case 6: block_rows<F, 6>(o, *job.in, b, 0, acc); break;
      case 5: block_rows<F, 5>(o, *job.in, b, 0, acc); break;
      case 4: block_rows<F, 4>(o, *job.in, b, 0, acc); break;
      case 3: block_rows<F, 3>(o, *job.in, b, 0, acc); break;
      case 2: block_rows<F, 2>(o, *job.in, b, 0, acc); break;
      default: block_rows<F, 1>(o, *job.in, b, 0, acc); break;
    }
  }
  store_wide(job, t * kWide, M, acc);
}

// The packed bytes of a group's super-block for ``qtype``; 0 for a type not packed.
inline int64_t group_bytes(int64_t qtype) {
  return qtype == tandem_gguf::Q4_K ? Q4K::kGroupBytes : qtype == tandem_gguf::Q6_K ? Q6K::kGroupBytes : 0;
}

}  // namespace rows16

}  // namespace tandem_gguf_vnni

#pragma GCC pop_options
