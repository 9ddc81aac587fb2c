// Q4_K and Q6_K weights against many input rows at once (a prompt's prefill chunk), on AVX-512
// VNNI: the same exact integers per block as the tiles of gguf_formats_vnni.h, so the same bits.
//
// Why: those tiles keep each (input row, weight row) pair's products in 16 int32 lanes, which
// must be summed across lanes per block (the block's fp32 step needs its exact integer), and
// unpack a weight row's block again for every few input rows; with hundreds of rows that
// bookkeeping is about half the work. Here a tile of 16 weight rows has each block unpacked
// once per call and laid out as llama.cpp's repacked formats lay it out: 4 consecutive codes
// of each of the 16 rows in one 64-byte vector. vpdpbusd against 4 input values broadcast then
// gives each lane one weight row's sum: no lane reduction at all, and the sub-block scales apply
// to 16 rows per multiply. The block is laid out in a small per-thread buffer (4 KB, in L1 while
// every input row passes over it), never stored: the file's bytes stay as they are.
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
constexpr int64_t kPrefillRows = 12;  // from this many input rows on, tiles of 16 weight rows pay
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
  alignas(64) uint8_t rows[kWide][256];     // the 16 rows' codes in value order, before the layout
};

// The codes in ``rows`` -> ``codes``: a 16 x 64 transpose of 32-bit words.
inline void lay_out(BlockTile& t) {
  const __m512i index = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(256));
  for (int g = 0; g < kGroups; ++g)
    _mm512_store_si512(t.codes[g], _mm512_i32gather_epi32(index, t.rows[0] + 4 * g, 1));
}

inline float half_to_float(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Q4_K block b of the 16 rows: codes 0..15 (bytes 32p .. 32p+31 of qs: low nibbles are values
// 64p .. 64p+31, high ones 64p+32 ..), 6-bit scales and mins, d and -dmin.
inline void unpack_q4k(const uint8_t* const* row, int64_t b, BlockTile& t) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int i = 0; i < kWide; ++i) {
    const uint8_t* blk = row[i] + b * 144;
    for (int p = 0; p < 4; ++p) {
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * p));
      _mm256_store_si256(reinterpret_cast<__m256i*>(t.rows[i] + 64 * p), _mm256_and_si256(bytes, m4));
      _mm256_store_si256(reinterpret_cast<__m256i*>(t.rows[i] + 64 * p + 32), _mm256_and_si256(_mm256_srli_epi16(bytes, 4), m4));
    }
    alignas(16) uint8_t sm[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(sm), tandem_gguf::k_scales_mins(blk + 4));
    for (int j = 0; j < 8; ++j) t.scale[j][i] = sm[j];
    for (int k = 0; k < 4; ++k) t.min_pairs[k][i] = static_cast<int32_t>(sm[8 + 2 * k]) | (static_cast<int32_t>(sm[9 + 2 * k]) << 16);
    t.d[i] = half_to_float(blk);
    t.o[i] = -half_to_float(blk + 2);
  }
  lay_out(t);
}

// Q6_K block b: codes 0..63 (value 128h + 32q + l: a nibble of ql byte 64h + l (+32 for odd q),
// the low one for q < 2, and bits 2q of qh byte 128 + 32h + l on top), 16 int8 scales, d.
inline void unpack_q6k(const uint8_t* const* row, int64_t b, BlockTile& t) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
  for (int i = 0; i < kWide; ++i) {
    const uint8_t* blk = row[i] + b * 210;
    for (int h = 0; h < 2; ++h) {
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h));
      const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
      const __m256i top[4] = {_mm256_and_si256(qh, m3), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m3),
                              _mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), _mm256_and_si256(_mm256_srli_epi16(qh, 6), m3)};
      const __m256i low[4] = {_mm256_and_si256(lo, m4), _mm256_and_si256(hi, m4), _mm256_and_si256(_mm256_srli_epi16(lo, 4), m4),
                              _mm256_and_si256(_mm256_srli_epi16(hi, 4), m4)};
      for (int q = 0; q < 4; ++q)
        _mm256_store_si256(reinterpret_cast<__m256i*>(t.rows[i] + 128 * h + 32 * q), _mm256_or_si256(low[q], _mm256_slli_epi16(top[q], 4)));
    }
    for (int j = 0; j < 16; ++j) t.scale[j][i] = static_cast<int8_t>(blk[192 + j]);
    t.d[i] = half_to_float(blk + 208);
  }
  lay_out(t);
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

constexpr int kRowsAtOnce = 4;

// Tile t (weight rows 16t .. 16t+15) of ``job`` against all M input rows.
template <bool kQ6>
inline void prefill_tile(const Job& job, int64_t t, int64_t M, BlockTile& tile, float* acc) {
  const int64_t n0 = t * kWide;
  const uint8_t* row[kWide];
  for (int i = 0; i < kWide; ++i) row[i] = job.W + std::min<int64_t>(n0 + i, job.N - 1) * job.row_bytes;
  std::fill(acc, acc + M * kWide, 0.0f);
  const int64_t blocks = job.in->K / 256;
  for (int64_t b = 0; b < blocks; ++b) {
    if constexpr (kQ6) unpack_q6k(row, b, tile);
    else unpack_q4k(row, b, tile);
    int64_t m = 0;
    for (; m + kRowsAtOnce <= M; m += kRowsAtOnce) block_rows<kQ6, kRowsAtOnce>(tile, *job.in, b, m, acc);
    for (; m < M; ++m) block_rows<kQ6, 1>(tile, *job.in, b, m, acc);
  }
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

inline int64_t prefill_tiles(const Job& job) { return (job.N + kWide - 1) / kWide; }

// Several weights on the same M input rows in one parallel region: the Q4_K / Q6_K ones in tiles
// of 16 rows here, any other type in gguf_tiles.h's tiles of 8. False (nothing computed) for a
// type neither covers.
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
    start[j + 1] = start[j] + (prefill_type(qtypes[j]) ? prefill_tiles(jobs[j]) : tile_count(jobs[j]));
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
      if (qtypes[j] == tandem_gguf::Q4_K) prefill_tile<false>(jobs[j], t, M, *tile, acc);
      else if (qtypes[j] == tandem_gguf::Q6_K) prefill_tile<true>(jobs[j], t, M, *tile, acc);
      else column_of(qtypes[j], jobs[j], t, M);
    }
  });
  return true;
}

}  // namespace tandem_gguf_vnni

#pragma GCC pop_options
