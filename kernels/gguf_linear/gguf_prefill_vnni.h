// Q4_K and Q6_K weights against several input rows at once (a prompt's prefill chunk, a
// verification of 5 drafts or more), on AVX-512 VNNI: the same exact integers per block as the
// tiles of gguf_formats_vnni.h, so the same bits.
//
// Why: those tiles keep each (input row, weight row) pair's products in 16 int32 lanes, which
// must be summed across lanes per block (the block's fp32 step needs its exact integer), and
// unpack a weight row's block again for every few input rows; with hundreds of rows that
// bookkeeping is about half the work. Here a tile of 16 weight rows has each block laid out once
// per call as llama.cpp's repacked formats lay it out, 4 consecutive codes of each of the 16 rows
// in one 64-byte vector (a register transpose of the rows' bytes); vpdpbusd against 4 input
// values broadcast then gives each lane one weight row's sum: no lane reduction at all, and the
// sub-block scales apply to 16 rows per multiply. The layout lives in a small per-thread buffer
// (4 KB, in L1 while every input row passes over it), never stored: the file's bytes stay as
// they are. The layout costs about what 5 input rows' products cost, hence kPrefillRows.
//
// For M new rows: per block, S = sum_j sc_j * dot_j (and Q4_K's Mn = sum_j min_j * xs32_j, Q6_K's
// -32 * sum_j sc_j * xs16_j) exactly as integers, then the fp32 steps of reference.py per 16
// weight rows in block order, element for element those of gguf_tiles.h. Inputs in the values'
// own order (not interleaved).
#pragma once
#include <immintrin.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c")

namespace tandem_gguf_vnni {

constexpr int kWide = 16;           // weight rows per tile: the 16 int32 lanes of a vector
constexpr int64_t kPrefillRows = 6;  // from this many input rows on these tiles pay (measured in the real runner)
constexpr int kGroups = 64;         // 4-code groups in a 256-value block

inline bool prefill_type(int64_t qtype) { return qtype == tandem_gguf::Q4_K || qtype == tandem_gguf::Q6_K; }

inline int32_t load_i32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// One block of 16 weight rows, laid out for the broadcast dot products, and what its fp32 step
// needs: scales per sub-block for the 16 rows, the rows' d (and Q4_K's -dmin).
struct BlockTile {
  alignas(64) uint8_t codes[kGroups][64];  // group g: row i's codes 4g .. 4g+3 at bytes 4i ..
  alignas(64) int32_t scale[16][kWide];     // sub-block j's scale per row (8 used by Q4_K)
  alignas(64) int32_t min_pairs[4][kWide];  // Q4_K: mins 2k, 2k+1 per row as two int16
  alignas(64) float d[kWide], o[kWide];
  alignas(64) int32_t words[kWide][4];      // the rows' scale bytes before their transpose
};

// r[i] (row i's 16 dwords) -> r[c]: dword c of every row, row i in lane i (a 16 x 16 transpose
// of 32-bit words: unpacks of row pairs, of pairs of pairs, then two 128-bit lane shuffles).
inline void transpose16(__m512i* r) {
  __m512i t[16], u[16];
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
  }
  // u[4k + j], 128-bit lane L: rows 4k .. 4k+3 of dword 4L + j.
  for (int k = 0; k < 4; ++k) {
    u[4 * k + 0] = _mm512_unpacklo_epi64(t[4 * k + 0], t[4 * k + 2]);
    u[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k + 0], t[4 * k + 2]);
    u[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
    u[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i x0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x44), x1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xEE);
    const __m512i y0 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x44), y1 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xEE);
    r[0 + j] = _mm512_shuffle_i32x4(x0, y0, 0x88);
    r[4 + j] = _mm512_shuffle_i32x4(x0, y0, 0xDD);
    r[8 + j] = _mm512_shuffle_i32x4(x1, y1, 0x88);
    r[12 + j] = _mm512_shuffle_i32x4(x1, y1, 0xDD);
  }
}

// The 64 bytes at ``offset`` of block b in each of the 16 rows, transposed (see transpose16).
inline void load_transposed(const uint8_t* const* row, int64_t block_bytes, int64_t b, int offset, __m512i* r) {
  for (int i = 0; i < kWide; ++i) r[i] = _mm512_loadu_si512(row[i] + b * block_bytes + offset);
  transpose16(r);
}

// The 32-bit word at ``offset`` of block b in each row, row i in lane i.
inline __m512i gather_words(const uint8_t* const* row, __m512i apart, int64_t block_bytes, int64_t b, int offset) {
  return _mm512_i32gather_epi32(apart, row[0] + b * block_bytes + offset, 1);
}

inline __m512 low_halves(__m512i w) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(w)); }
inline __m512 high_halves(__m512i w) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(w, 16))); }

// The rows' 16 scale bytes (``words``, 4 dwords a row) -> 4 vectors, vector k holding each row's
// dword k.
inline void scale_dwords(const BlockTile& t, __m512i* z) {
  const __m512i index = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(16));
  for (int k = 0; k < 4; ++k) z[k] = _mm512_i32gather_epi32(index, reinterpret_cast<const uint8_t*>(t.words) + 4 * k, 1);
}

inline __m512i byte_of(__m512i w, int k) { return _mm512_and_si512(_mm512_srli_epi32(w, 8 * k), _mm512_set1_epi32(0xFF)); }

// Q4_K block b of the 16 rows: codes 0..15 (bytes 32p .. 32p+31 of qs: low nibbles are values
// 64p .. 64p+31, high ones 64p+32 ..), 6-bit scales and mins, d and -dmin.
inline void unpack_q4k(const uint8_t* const* row, __m512i apart, int64_t b, BlockTile& t) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  for (int h = 0; h < 2; ++h) {
    __m512i r[kWide];
    load_transposed(row, 144, b, 16 + 64 * h, r);
    for (int c = 0; c < 16; ++c) {  // dword c: pair p = 2h + c / 8, its bytes 4e .. 4e+3 (e = c % 8)
      const int p = 2 * h + c / 8, e = c % 8;
      _mm512_store_si512(t.codes[16 * p + e], _mm512_and_si512(r[c], m4));
      _mm512_store_si512(t.codes[16 * p + 8 + e], _mm512_and_si512(_mm512_srli_epi16(r[c], 4), m4));
    }
  }
  for (int i = 0; i < kWide; ++i)
    _mm_store_si128(reinterpret_cast<__m128i*>(t.words[i]), tandem_gguf::k_scales_mins(row[i] + b * 144 + 4));
  __m512i z[4];  // scales 0-3, 4-7, mins 0-3, 4-7 (a byte each)
  scale_dwords(t, z);
  for (int j = 0; j < 8; ++j) _mm512_store_si512(t.scale[j], byte_of(z[j / 4], j % 4));
  for (int k = 0; k < 4; ++k) {
    const __m512i w = z[2 + k / 2];
    _mm512_store_si512(t.min_pairs[k], _mm512_or_si512(byte_of(w, 2 * (k % 2)), _mm512_slli_epi32(byte_of(w, 2 * (k % 2) + 1), 16)));
  }
  const __m512i dd = gather_words(row, apart, 144, b, 0);  // d | dmin
  _mm512_store_ps(t.d, low_halves(dd));
  _mm512_store_ps(t.o, _mm512_xor_ps(high_halves(dd), _mm512_set1_ps(-0.0f)));  // -dmin, as the tiles of 8 negate it
}

// Q6_K block b: codes 0..63 (value 128h + 32q + l: a nibble of ql byte 64h + l (+32 for odd q),
// the low one for q < 2, and bits 2q of qh byte 128 + 32h + l on top), 16 int8 scales, d.
inline void unpack_q6k(const uint8_t* const* row, __m512i apart, int64_t b, BlockTile& t) {
  const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(3);
  __m512i qh[kWide];
  load_transposed(row, 210, b, 128, qh);  // dword 8h + e: qh bytes 32h + 4e ..
  for (int h = 0; h < 2; ++h) {
    __m512i ql[kWide];
    load_transposed(row, 210, b, 64 * h, ql);  // dword c: ql bytes 64h + 4c ..
    for (int e = 0; e < 8; ++e) {
      const __m512i top = qh[8 * h + e];
      const __m512i low[4] = {_mm512_and_si512(ql[e], m4), _mm512_and_si512(ql[8 + e], m4),
                              _mm512_and_si512(_mm512_srli_epi16(ql[e], 4), m4), _mm512_and_si512(_mm512_srli_epi16(ql[8 + e], 4), m4)};
      for (int q = 0; q < 4; ++q) {
        const __m512i bits = _mm512_and_si512(_mm512_srli_epi16(top, 2 * q), m3);
        _mm512_store_si512(t.codes[32 * h + 8 * q + e], _mm512_or_si512(low[q], _mm512_slli_epi16(bits, 4)));
      }
    }
  }
  for (int i = 0; i < kWide; ++i)
    _mm_store_si128(reinterpret_cast<__m128i*>(t.words[i]), _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[i] + b * 210 + 192)));
  __m512i z[4];
  scale_dwords(t, z);
  for (int j = 0; j < 16; ++j)  // signed bytes
    _mm512_store_si512(t.scale[j], _mm512_srai_epi32(_mm512_slli_epi32(z[j / 4], 24 - 8 * (j % 4)), 24));
  _mm512_store_ps(t.d, high_halves(gather_words(row, apart, 210, b, 206)));  // d at 208
}

// For the AMX tiles (gguf_amx.h), which lay the codes out their own way: the scales part of
// unpack_q4k / unpack_q6k alone, and the rows of a tile. (The prefill tiles below keep their own
// inlined copies: calling these from prefill_tile made 16 rows 1.27x slower.)

// Q4_K block b's scales and mins per sub-block for the 16 rows, d and -dmin.
inline void q4k_scales(const uint8_t* const* row, __m512i apart, int64_t b, BlockTile& t) {
  for (int i = 0; i < kWide; ++i)
    _mm_store_si128(reinterpret_cast<__m128i*>(t.words[i]), tandem_gguf::k_scales_mins(row[i] + b * 144 + 4));
  __m512i z[4];  // scales 0-3, 4-7, mins 0-3, 4-7 (a byte each)
  scale_dwords(t, z);
  for (int j = 0; j < 8; ++j) _mm512_store_si512(t.scale[j], byte_of(z[j / 4], j % 4));
  for (int k = 0; k < 4; ++k) {
    const __m512i w = z[2 + k / 2];
    _mm512_store_si512(t.min_pairs[k], _mm512_or_si512(byte_of(w, 2 * (k % 2)), _mm512_slli_epi32(byte_of(w, 2 * (k % 2) + 1), 16)));
  }
  const __m512i dd = gather_words(row, apart, 144, b, 0);  // d | dmin
  _mm512_store_ps(t.d, low_halves(dd));
  _mm512_store_ps(t.o, _mm512_xor_ps(high_halves(dd), _mm512_set1_ps(-0.0f)));  // -dmin, as the tiles of 8 negate it
}

// Q6_K block b's 16 signed scales for the 16 rows, and d.
inline void q6k_scales(const uint8_t* const* row, __m512i apart, int64_t b, BlockTile& t) {
  for (int i = 0; i < kWide; ++i)
    _mm_store_si128(reinterpret_cast<__m128i*>(t.words[i]), _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[i] + b * 210 + 192)));
  __m512i z[4];
  scale_dwords(t, z);
  for (int j = 0; j < 16; ++j)  // signed bytes
    _mm512_store_si512(t.scale[j], _mm512_srai_epi32(_mm512_slli_epi32(z[j / 4], 24 - 8 * (j % 4)), 24));
  _mm512_store_ps(t.d, high_halves(gather_words(row, apart, 210, b, 206)));  // d at 208
}

// The 16 weight rows of tile t from ``job`` (the last row repeated past N), and their distances
// from the first for the gathers.
inline __m512i weight_rows(const Job& job, int64_t t, const uint8_t** row) {
  const int64_t n0 = t * kWide;
  alignas(64) int32_t apart[kWide];
  for (int i = 0; i < kWide; ++i) {
    row[i] = job.W + std::min<int64_t>(n0 + i, job.N - 1) * job.row_bytes;
    apart[i] = static_cast<int32_t>(row[i] - row[0]);
  }
  return _mm512_load_si512(apart);
}

// Input rows m0 .. m0+R-1 against the laid-out block b: their exact S (and Mn), then the fp32
// step into acc (16 lanes per row, in memory: every block adds to it in order).
template <bool kQ6, int R>
inline void block_rows(const BlockTile& t, const Inputs& in, int64_t b, int64_t m0, float* acc) {
  const int8_t* x[R];
  for (int r = 0; r < R; ++r) x[r] = in.row(m0 + r) + b * 256;
  __m512i S[R];
  for (int r = 0; r < R; ++r) S[r] = _mm512_setzero_si512();
  constexpr int kSub = kQ6 ? 16 : 8, kPer = kGroups / kSub;  // sub-blocks, 4-code groups in each
  for (int j = 0; j < kSub; ++j) {
    __m512i dot[R];
    for (int r = 0; r < R; ++r) dot[r] = _mm512_setzero_si512();
    for (int k = 0; k < kPer; ++k) {
      const int g = j * kPer + k;
      const __m512i w = _mm512_load_si512(t.codes[g]);
      for (int r = 0; r < R; ++r) dot[r] = _mm512_dpbusd_epi32(dot[r], w, _mm512_set1_epi32(load_i32(x[r] + 4 * g)));
    }
    const __m512i sc = _mm512_load_si512(t.scale[j]);
    for (int r = 0; r < R; ++r) {
      if constexpr (kQ6) dot[r] = _mm512_sub_epi32(dot[r], _mm512_set1_epi32(32 * in.sums16(m0 + r)[b * 16 + j]));
      S[r] = _mm512_add_epi32(S[r], _mm512_mullo_epi32(dot[r], sc));
    }
  }
  const __m512 dv = _mm512_load_ps(t.d);
  for (int r = 0; r < R; ++r) {
    const __m512 dxv = _mm512_set1_ps(in.scale(m0 + r, b));
    __m512 step = _mm512_mul_ps(_mm512_mul_ps(dv, dxv), _mm512_cvtepi32_ps(S[r]));
    if constexpr (!kQ6) {
      const int16_t* xs = in.sums32(m0 + r) + b * 8;
      __m512i mn = _mm512_setzero_si512();
      for (int k = 0; k < 4; ++k)
        mn = _mm512_dpwssd_epi32(mn, _mm512_load_si512(t.min_pairs[k]), _mm512_set1_epi32(load_i32(xs + 2 * k)));
      step = _mm512_add_ps(step, _mm512_mul_ps(_mm512_mul_ps(_mm512_load_ps(t.o), dxv), _mm512_cvtepi32_ps(mn)));
    }
    float* a = acc + (m0 + r) * kWide;
    _mm512_store_ps(a, _mm512_add_ps(_mm512_load_ps(a), step));
  }
}

// acc (16 lanes per input row: weight rows n0 .. n0+15) (+ the bias) -> the outputs of the rows below N.
inline void store_wide(const Job& job, int64_t n0, int64_t M, const float* acc) {
  const int64_t valid = std::min<int64_t>(kWide, job.N - n0);
  alignas(64) float bias[kWide] = {0};
  if (job.B)
    for (int64_t i = 0; i < valid; ++i) bias[i] = job.B[n0 + i];
  for (int64_t m = 0; m < M; ++m) {
    const __m512 a = _mm512_load_ps(acc + m * kWide);
    const __m512 y = job.B ? _mm512_add_ps(a, _mm512_load_ps(bias)) : a;
    float* out = job.O + m * job.ldo + n0;
    if (valid == kWide) {
      _mm512_storeu_ps(out, y);
    } else {
      alignas(64) float lanes[kWide];
      _mm512_store_ps(lanes, y);
      for (int64_t i = 0; i < valid; ++i) out[i] = lanes[i];
    }
  }
}

constexpr int kRowsAtOnce = 6;  // input rows sharing each laid-out vector loaded

// Tile t (weight rows 16t .. 16t+15) of ``job`` against all M input rows.
template <bool kQ6>
inline void prefill_tile(const Job& job, int64_t t, int64_t M, BlockTile& tile, float* acc) {
  const int64_t n0 = t * kWide;
  const uint8_t* row[kWide];
  alignas(64) int32_t apart[kWide];  // the rows' distances from the first, for the gathers
  for (int i = 0; i < kWide; ++i) {
    row[i] = job.W + std::min<int64_t>(n0 + i, job.N - 1) * job.row_bytes;
    apart[i] = static_cast<int32_t>(row[i] - row[0]);
  }
  const __m512i offsets = _mm512_load_si512(apart);
  std::fill(acc, acc + M * kWide, 0.0f);
  const int64_t blocks = job.in->K / 256;
  constexpr int64_t kBlockBytes = kQ6 ? 210 : 144;
  for (int64_t b = 0; b < blocks; ++b) {
    // Fetch the 16 rows' blocks two ahead into L2 (the next tile's first ones near the end):
    // sixteen rows a block apart are sixteen short streams, which the hardware prefetcher alone
    // follows poorly, and with few input rows the tile would wait on memory.
    const int64_t ahead = b + 2;
    for (int i = 0; i < kWide; ++i) {
      const int64_t n = ahead < blocks ? n0 + i : std::min<int64_t>(n0 + kWide + i, job.N - 1);
      const char* p = reinterpret_cast<const char*>(job.W + std::min<int64_t>(n, job.N - 1) * job.row_bytes +
                                                    (ahead < blocks ? ahead : ahead - blocks) * kBlockBytes);
      for (int64_t l = kBlockBytes - 1; l >= 0; l -= 64) _mm_prefetch(p + l, _MM_HINT_T1);
    }
    if constexpr (kQ6) unpack_q6k(row, offsets, b, tile);
    else unpack_q4k(row, offsets, b, tile);
    int64_t m = 0;
    for (; m + kRowsAtOnce <= M; m += kRowsAtOnce) block_rows<kQ6, kRowsAtOnce>(tile, *job.in, b, m, acc);
    switch (M - m) {  // the rest in one go: each laid-out vector loaded once for all of them
      case 5: block_rows<kQ6, 5>(tile, *job.in, b, m, acc); break;
      case 4: block_rows<kQ6, 4>(tile, *job.in, b, m, acc); break;
      case 3: block_rows<kQ6, 3>(tile, *job.in, b, m, acc); break;
      case 2: block_rows<kQ6, 2>(tile, *job.in, b, m, acc); break;
      case 1: block_rows<kQ6, 1>(tile, *job.in, b, m, acc); break;
      default: break;
    }
  }
  store_wide(job, n0, M, acc);
}

inline int64_t prefill_tiles(const Job& job) { return (job.N + kWide - 1) / kWide; }

}  // namespace tandem_gguf_vnni

#pragma GCC pop_options

#include "gguf_rows16_vnni.h"  // rows16: Q4_K and Q6_K packed at load in groups of 16 rows

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c")

namespace tandem_gguf_vnni {

// Whether a job runs on tiles of 16 rows: where its weight was packed for them (rows16), or a
// Q4_K / Q6_K file layout against enough input rows to pay for laying each block out per call.
inline bool wide(const Job& job, int64_t qtype, int64_t M) { return job.P || (prefill_type(qtype) && M >= kPrefillRows); }

// Several weights on the same M input rows in one parallel region: packed Q4_K / Q6_K and,
// against kPrefillRows or more, the file's Q4_K / Q6_K in tiles of 16 rows, the rest in gguf_tiles.h's
// tiles of 8. False (nothing computed) for a type neither covers.
inline bool prefill_group(const Job* jobs, const int64_t* qtypes, int64_t count, int64_t M) {
  constexpr int64_t kMaxGroup = 8;
  if (count < 1 || count > kMaxGroup) return false;
  int64_t start[kMaxGroup + 1] = {0};
  for (int64_t j = 0; j < count; ++j) {
    switch (qtypes[j]) {
      case tandem_gguf::Q4_0: case tandem_gguf::Q4_1: case tandem_gguf::Q5_0: case tandem_gguf::Q5_1:
      case tandem_gguf::Q8_0: case tandem_gguf::Q4_K: case tandem_gguf::Q5_K: case tandem_gguf::Q6_K: break;
      default: return false;
    }
    start[j + 1] = start[j] + (wide(jobs[j], qtypes[j], M) ? prefill_tiles(jobs[j]) : tile_count(jobs[j]));
  }
  const int64_t units = start[count];
  if (units == 0) return true;
  at::parallel_for(0, units, 1, [&](int64_t u0, int64_t u1) {
    std::unique_ptr<BlockTile> tile(new BlockTile);
    std::vector<float, std::allocator<float>> storage(M * kWide + 16);
    // 64-byte aligned accumulators for the aligned loads and stores above.
    float* acc = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(storage.data()) + 63) & ~uintptr_t(63));
    int64_t j = 0;
    for (int64_t u = u0; u < u1; ++u) {
      while (u >= start[j + 1]) ++j;
      const int64_t t = u - start[j];
      if (jobs[j].P && qtypes[j] == tandem_gguf::Q6_K) rows16::tile<rows16::Q6K>(jobs[j], t, M, *tile, acc);
      else if (jobs[j].P) rows16::tile<rows16::Q4K>(jobs[j], t, M, *tile, acc);
      else if (!wide(jobs[j], qtypes[j], M)) column_of(qtypes[j], jobs[j], t, M);
      else if (qtypes[j] == tandem_gguf::Q4_K) prefill_tile<false>(jobs[j], t, M, *tile, acc);
      else prefill_tile<true>(jobs[j], t, M, *tile, acc);
    }
  });
  return true;
}

}  // namespace tandem_gguf_vnni

#pragma GCC pop_options
