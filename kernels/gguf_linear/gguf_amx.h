// Q4_K and Q6_K weights against many input rows (a prompt's prefill chunk) on
// AMX-INT8 tiles, where the CPU and the OS allow them: the same exact integers per block as
// gguf_prefill_vnni.h, so the same bits.
//
// Why: the VNNI tiles spend, per input row and block of 16 weight rows, 64 vpdpbusd (one port)
// and then a multiply per sub-block to apply its scale. Here each weight code is multiplied by
// its sub-block's scale once per block, for all input rows: the product (Q4_K: code * scale in
// 0 .. 945; Q6_K: (code - 32) * scale in -4064 .. 4096) is written in base 256, a tile of low
// digits (unsigned bytes) and one of high ones (unsigned for Q4_K, signed for Q6_K), and the
// TMUL unit computes S = low . x + 256 * high . x over the whole 256-value block, 16 weight
// rows by 16 input rows, in 8 instructions of 64 values and two tile stores. Every partial sum
// is an integer well inside int32 (|S| < 2^28), so S is exactly the VNNI tiles' S; Q4_K's mins
// (Mn) stay on vpdpwssd, and the fp32 steps are block_rows' element for element.
//
// Layout (orientation: A = weights, B = inputs, so no transpose of the file's rows): A holds
// the 16 weight rows' digits, each row's 256 values in a 256-byte row (tiles read 64 of them);
// B holds 16 input rows' int8 values in groups of 4 (AMX's B layout: group g of every input row
// in one 64-byte row), built once per call and shared by every weight tile; C is 16 weight rows
// x 16 input rows of int32. A call with fewer than 16 rows pads B with zero rows; a last partial
// chunk of rows takes the 16 last rows again and keeps only the new ones.
//
// The digits cost about what 10 input rows cost the VNNI tiles, whatever the rows: in the real
// runner these tiles lose to the VNNI ones up to at least 16 rows (a verification), and a
// prompt's prefill chunk of 512 rows runs 1.4x faster; gguf_linear_avx2.cpp's kAmxRows.
#pragma once
#include <immintrin.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gguf_prefill_vnni.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,amx-tile,amx-int8")

namespace tandem_gguf_amx {

using tandem_gguf::Inputs;
using tandem_gguf_vnni::BlockTile;
using tandem_gguf_vnni::Job;
using tandem_gguf_vnni::kWide;

constexpr int kRows = 16;  // input rows per chunk: a C tile's columns

// AMX-INT8 where the CPU has it and Linux lets this process use the tiles' state: the kernel
// refuses a tile instruction (SIGILL) until the process asks for XTILEDATA, once.
inline bool cpu_has_amx_int8() {
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!(d & (1u << 24)) || !(d & (1u << 25))) return false;  // AMX-TILE, AMX-INT8
#ifdef SYS_arch_prctl
    constexpr int kReqXcompPerm = 0x1023, kXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
#else
    return false;
#endif
  }();
  return has;
}

// TANDEM_AMX=0 turns these tiles off (the VNNI ones run), to measure both on one machine.
inline bool amx_allowed_by_env() {
  const char* env = std::getenv("TANDEM_AMX");
  return env == nullptr || std::string(env) != "0";
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {0};
  uint16_t colsb[16] = {0};
  uint8_t rows[16] = {0};
};

// Every tile 16 rows of 64 bytes: C 0 and 1 (the low and high digits' sums, int32), A 2, 3, 6, 7
// (two 64-value slices' low and high digits), B 4 and 5 (the inputs of those slices).
inline void configure() {
  TileConfig cfg;
  for (int i = 0; i < 8; ++i) cfg.rows[i] = 16, cfg.colsb[i] = 64;
  asm volatile("" ::: "memory");  // ldtilecfg's operand names only the config's first bytes
  _tile_loadconfig(&cfg);
}

// The sub-blocks of a Q4_K row laid out by digits_q4k, in their order.
constexpr int kQ4Order[8] = {0, 2, 1, 3, 4, 6, 5, 7};

// The inputs as the B tiles read them, built once per call for all weight tiles: for chunk c of
// 16 input rows (rows m0[c] ..; past row M zeros), group g of block b, the 16 rows' 4 values side
// by side, groups in the values' order (Q6_K) or in digits_q4k's (Q4_K); and per (chunk, block)
// 16-lane vectors of the rows' dx and Q4_K's input sum pairs.
struct Prepared {
  int64_t M = 0, chunks = 0, blocks = 0;
  std::vector<int64_t> m0;
  std::vector<int32_t> groups, groups4;  // [chunk][block][64][16]
  std::vector<float> dx;                 // [chunk][block][16]
  std::vector<int32_t> xs;               // [chunk][block][4][16]
};

// The buffers keep their memory from call to call (a prompt's chunk fills megabytes).
inline void prepare(const Inputs& in, int64_t M, Prepared& p, bool q6, bool q4) {
  p.M = M;
  p.chunks = (M + kRows - 1) / kRows;
  p.blocks = in.K / 256;
  const int64_t units = p.chunks * p.blocks;
  p.m0.resize(p.chunks);
  if (q6) p.groups.resize(units * 64 * kRows);
  if (q4) p.groups4.resize(units * 64 * kRows);
  p.dx.resize(units * kWide);
  p.xs.resize(units * 4 * kWide);
  const std::vector<int8_t> zeros(256, 0);
  for (int64_t c = 0; c < p.chunks; ++c) {
    const int64_t m0 = p.m0[c] = M < kRows ? 0 : std::min<int64_t>(c * kRows, M - kRows);
    const int rows = static_cast<int>(std::min<int64_t>(kRows, M - m0));
    for (int64_t b = 0; b < p.blocks; ++b) {
      const int64_t u = c * p.blocks + b;
      for (int r = 0; r < kWide; ++r) {
        p.dx[u * kWide + r] = r < rows ? in.scale(m0 + r, b) : 0.0f;
        for (int k = 0; k < 4; ++k)
          p.xs[(u * 4 + k) * kWide + r] = r < rows ? tandem_gguf_vnni::load_i32(in.sums32(m0 + r) + b * 8 + 2 * k) : 0;
      }
      for (int piece = 0; piece < 4; ++piece) {  // the rows' 64-byte pieces transposed to groups of 4 values
        __m512i v[kWide];
        for (int r = 0; r < kWide; ++r)
          v[r] = _mm512_loadu_si512(r < rows ? in.row(m0 + r) + b * 256 + 64 * piece : zeros.data());
        tandem_gguf_vnni::transpose16(v);  // v[k]: group 16 * piece + k of every row
        for (int k = 0; k < kWide; ++k) {
          const int g = 16 * piece + k;  // values 4g .. 4g+3: sub-block g / 8, its group g % 8
          if (q6) _mm512_storeu_si512(p.groups.data() + (u * 64 + g) * kRows, v[k]);
          if (q4) {  // at slot s of digits_q4k's order, kQ4Order[s] = g / 8
            const int j = g / 8, slot = j % 4 == 1 ? j + 1 : j % 4 == 2 ? j - 1 : j;
            _mm512_storeu_si512(p.groups4.data() + (u * 64 + 8 * slot + g % 8) * kRows, v[k]);
          }
        }
      }
    }
  }
}

// A thread's buffers: a block of the 16 weight rows' digits (two, so that a block's are written
// while the tiles may still read the last's), their scales (BlockTile's; its codes unused), the
// stored sums, the accumulators.
struct Scratch {
  alignas(64) uint8_t digits[2][2][kWide][256];  // [which buffer][low, high][weight row][value]
  alignas(64) int32_t dots[2][kWide * kRows];     // [low, high][weight row * 16 + input row]
  BlockTile scales;
  std::vector<float> storage;
  float* acc = nullptr;  // [chunk][weight row * 16 + input row], 64-byte aligned
};

// Q4_K block b of the 16 rows: code * scale in base 256. Each 64 bytes of qs become their low
// nibbles' products, then their high nibbles'; 32 bytes of qs hold values 64p .. 64p+31 in their
// low nibbles and the next 32 in their high ones, so a row holds sub-blocks 0 2 1 3 4 6 5 7 of
// 32 values (kQ4Order). The products are vpmaddubsw's: a code times its scale, its neighbour
// times 0.
inline void digits_q4k(const uint8_t* const* row, int64_t b, Scratch& s, int flip) {
  const __m512i m4 = _mm512_set1_epi8(0x0F), low_bytes = _mm512_set1_epi16(0x00FF), high_bytes = _mm512_set1_epi16(-256);
  const BlockTile& t = s.scales;
  for (int i = 0; i < kWide; ++i) {
    const uint8_t* qs = row[i] + b * 144 + 16;
    for (int h = 0; h < 2; ++h) {
      const __m512i v = _mm512_loadu_si512(qs + 64 * h);
      for (int half = 0; half < 2; ++half) {  // low nibbles: sub-blocks 4h, 4h + 2; high ones 4h + 1, 4h + 3
        const __m512i codes = half ? _mm512_and_si512(_mm512_srli_epi16(v, 4), m4) : _mm512_and_si512(v, m4);
        const int ja = 4 * h + half, jb = ja + 2;
        const __m512i even = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16(static_cast<short>(t.scale[ja][i])),
                                                     _mm512_set1_epi16(static_cast<short>(t.scale[jb][i])));
        const __m512i pe = _mm512_maddubs_epi16(codes, even), po = _mm512_maddubs_epi16(codes, _mm512_slli_epi16(even, 8));
        const int at = 128 * h + 64 * half;
        _mm512_store_si512(s.digits[flip][0][i] + at, _mm512_or_si512(_mm512_and_si512(pe, low_bytes), _mm512_slli_epi16(po, 8)));
        _mm512_store_si512(s.digits[flip][1][i] + at, _mm512_or_si512(_mm512_srli_epi16(pe, 8), _mm512_and_si512(po, high_bytes)));
      }
    }
  }
}

// Q6_K block b: (code - 32) * scale in base 256, the high digit signed, each row's values in
// their own order. Value 128h + 32q + l: a nibble of ql byte 64h + l (+32 for odd q), the low one
// for q < 2, bits 2q of qh byte 32h + l on top; the scales are the row's own 16 signed bytes.
inline void digits_q6k(const uint8_t* const* row, int64_t b, Scratch& s, int flip) {
  const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(3);
  const __m512i low_bytes = _mm512_set1_epi16(0x00FF), high_bytes = _mm512_set1_epi16(-256);
  const __m512i shift_a = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
  const __m512i shift_b = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
  // Word w of the 64 values from sub-block j0 on: sub-block j0 + w / 8.
  const __m512i spread = _mm512_srli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16,
                                                             15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 3);
  for (int i = 0; i < kWide; ++i) {
    const uint8_t* q = row[i] + b * 210;
    const __m512i sc = _mm512_castsi256_si512(
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 192))));  // 16 signed words
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(q + 64 * h);
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 128 + 32 * h)));
      for (int half = 0; half < 2; ++half) {  // values 128h + 64 half ..: sub-blocks 8h + 4 half ..
        const __m512i codes =
            half ? _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                   _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, shift_b), m3), 4))
                 : _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, shift_a), m3), 4));
        const __m512i scale = _mm512_permutexvar_epi16(_mm512_add_epi16(spread, _mm512_set1_epi16(static_cast<short>(8 * h + 4 * half))), sc);
        const __m512i even = _mm512_and_si512(scale, low_bytes), offset = _mm512_slli_epi16(scale, 5);  // 32 * scale
        const __m512i pe = _mm512_sub_epi16(_mm512_maddubs_epi16(codes, even), offset);
        const __m512i po = _mm512_sub_epi16(_mm512_maddubs_epi16(codes, _mm512_slli_epi16(even, 8)), offset);
        const int at = 128 * h + 64 * half;
        _mm512_store_si512(s.digits[flip][0][i] + at, _mm512_or_si512(_mm512_and_si512(pe, low_bytes), _mm512_slli_epi16(po, 8)));
        _mm512_store_si512(s.digits[flip][1][i] + at, _mm512_or_si512(_mm512_srli_epi16(pe, 8), _mm512_and_si512(po, high_bytes)));
      }
    }
  }
}

// The low and high digits' sums of block b for chunk c: dots[0], dots[1], each [weight row]
// [input row].
template <bool kQ6>
inline void block_digits(const Prepared& p, int64_t c, int64_t b, Scratch& s, int flip) {
  const int32_t* g = (kQ6 ? p.groups : p.groups4).data() + ((c * p.blocks + b) * 64) * kRows;
  const uint8_t* lo = s.digits[flip][0][0];
  const uint8_t* hi = s.digits[flip][1][0];
  // Q6_K's high digits are signed.
#define TANDEM_AMX_HIGH(C, A, B) \
  if constexpr (kQ6) _tile_dpbssd(C, A, B); else _tile_dpbusd(C, A, B);
  asm volatile("" ::: "memory");  // the tile loads read what the digits just stored
  _tile_zero(0);
  _tile_zero(1);
  _tile_loadd(4, g, 64);
  _tile_loadd(2, lo, 256);
  _tile_loadd(3, hi, 256);
  _tile_dpbusd(0, 2, 4);
  TANDEM_AMX_HIGH(1, 3, 4);
  _tile_loadd(5, g + 256, 64);
  _tile_loadd(6, lo + 64, 256);
  _tile_loadd(7, hi + 64, 256);
  _tile_dpbusd(0, 6, 5);
  TANDEM_AMX_HIGH(1, 7, 5);
  _tile_loadd(4, g + 512, 64);
  _tile_loadd(2, lo + 128, 256);
  _tile_loadd(3, hi + 128, 256);
  _tile_dpbusd(0, 2, 4);
  TANDEM_AMX_HIGH(1, 3, 4);
  _tile_loadd(5, g + 768, 64);
  _tile_loadd(6, lo + 192, 256);
  _tile_loadd(7, hi + 192, 256);
  _tile_dpbusd(0, 6, 5);
  TANDEM_AMX_HIGH(1, 7, 5);
  _tile_stored(0, s.dots[0], 64);
  _tile_stored(1, s.dots[1], 64);
#undef TANDEM_AMX_HIGH
}

// Chunk c of block b from its digit sums: per weight row a vector of its 16 input rows, exact S
// (and Q4_K's Mn), then the fp32 step into acc, operation for operation block_rows'.
template <bool kQ6>
inline void steps_digits(const Prepared& p, int64_t c, int64_t b, Scratch& s) {
  const BlockTile& t = s.scales;
  const __m512 dxv = _mm512_loadu_ps(p.dx.data() + (c * p.blocks + b) * kWide);
  const int32_t* xs = p.xs.data() + (c * p.blocks + b) * 4 * kWide;  // Q4_K's
  const __m512i xs0 = _mm512_loadu_si512(xs), xs1 = _mm512_loadu_si512(xs + kWide), xs2 = _mm512_loadu_si512(xs + 2 * kWide),
                xs3 = _mm512_loadu_si512(xs + 3 * kWide);
  float* acc = s.acc + c * kWide * kRows;
  for (int i = 0; i < kWide; ++i) {
    const __m512i S = _mm512_add_epi32(_mm512_load_si512(s.dots[0] + kWide * i),
                                       _mm512_slli_epi32(_mm512_load_si512(s.dots[1] + kWide * i), 8));
    __m512 step = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(t.d[i]), dxv), _mm512_cvtepi32_ps(S));
    if constexpr (!kQ6) {
      __m512i mn = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_set1_epi32(t.min_pairs[0][i]), xs0);
      mn = _mm512_dpwssd_epi32(mn, _mm512_set1_epi32(t.min_pairs[1][i]), xs1);
      mn = _mm512_dpwssd_epi32(mn, _mm512_set1_epi32(t.min_pairs[2][i]), xs2);
      mn = _mm512_dpwssd_epi32(mn, _mm512_set1_epi32(t.min_pairs[3][i]), xs3);
      step = _mm512_add_ps(step, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(t.o[i]), dxv), _mm512_cvtepi32_ps(mn)));
    }
    float* a = acc + kWide * i;
    _mm512_store_ps(a, _mm512_add_ps(_mm512_load_ps(a), step));
  }
}

constexpr int64_t kTilesAhead = 2;

// The 16 rows of a tile are one stretch of the file (16 x row_bytes), walked here a block of
// each row at a time: fetch the stretch kTilesAhead tiles on into L2, a slice per block, so that
// it streams from memory while this tile computes.
inline void prefetch_tile_ahead(const Job& job, int64_t n0, int64_t b, int64_t blocks) {
  const int64_t stretch = kWide * job.row_bytes, slice = (stretch + blocks - 1) / blocks;
  const char* end = reinterpret_cast<const char*>(job.W + job.N * job.row_bytes);
  const char* from = reinterpret_cast<const char*>(job.W + (n0 + kTilesAhead * kWide) * job.row_bytes) + b * slice;
  for (int64_t l = 0; l < slice + 64 && from + l < end; l += 64) _mm_prefetch(from + l, _MM_HINT_T1);
}

// Tile t (weight rows 16t .. 16t+15) of ``job`` against all M input rows (tiles configured).
template <bool kQ6>
inline void amx_tile(const Job& job, const Prepared& p, int64_t t, Scratch& s) {
  const int64_t n0 = t * kWide;
  const uint8_t* row[kWide];
  const __m512i offsets = tandem_gguf_vnni::weight_rows(job, t, row);
  std::fill(s.acc, s.acc + p.chunks * kWide * kRows, 0.0f);
  int flip = 0;
  for (int64_t b = 0; b < p.blocks; ++b) {
    prefetch_tile_ahead(job, n0, b, p.blocks);
    flip ^= 1;
    if constexpr (kQ6) {
      tandem_gguf_vnni::q6k_scales(row, offsets, b, s.scales);
      digits_q6k(row, b, s, flip);
    } else {
      tandem_gguf_vnni::q4k_scales(row, offsets, b, s.scales);
      digits_q4k(row, b, s, flip);
    }
    for (int64_t c = 0; c < p.chunks; ++c) {
      block_digits<kQ6>(p, c, b, s, flip);
      steps_digits<kQ6>(p, c, b, s);
    }
  }
  const int64_t valid = std::min<int64_t>(kWide, job.N - n0);
  for (int64_t c = 0; c < p.chunks; ++c) {
    const float* acc = s.acc + c * kWide * kRows;
    const int64_t last = std::min<int64_t>(p.M, p.m0[c] + kRows);
    for (int64_t m = std::min<int64_t>(c * kRows, p.M); m < last; ++m) {  // the chunk's new rows
      const int64_t r = m - p.m0[c];
      float* out = job.O + m * job.ldo + n0;
      for (int64_t i = 0; i < valid; ++i) out[i] = job.B ? acc[i * kRows + r] + job.B[n0 + i] : acc[i * kRows + r];
    }
  }
}

// Several weights on the same M input rows in one parallel region: the Q4_K / Q6_K ones on these
// tiles, any other type on gguf_tiles.h's VNNI tiles of 8. False (nothing computed) for a type
// neither covers, or Q4_K / Q6_K weights reading different input layouts.
inline bool amx_group(const Job* jobs, const int64_t* qtypes, int64_t count, int64_t M) {
  constexpr int64_t kMaxGroup = 8;
  if (count < 1 || count > kMaxGroup) return false;
  int64_t start[kMaxGroup + 1] = {0};
  const Inputs* in = nullptr;
  bool q4 = false, q6 = false;
  for (int64_t j = 0; j < count; ++j) {
    switch (qtypes[j]) {
      case tandem_gguf::Q4_0: case tandem_gguf::Q4_1: case tandem_gguf::Q5_0: case tandem_gguf::Q5_1:
      case tandem_gguf::Q8_0: case tandem_gguf::Q4_K: case tandem_gguf::Q5_K: case tandem_gguf::Q6_K: break;
      default: return false;
    }
    const bool mine = tandem_gguf_vnni::prefill_type(qtypes[j]);
    if (mine) {
      if (in != nullptr && in != jobs[j].in) return false;
      in = jobs[j].in;
      q4 = q4 || qtypes[j] == tandem_gguf::Q4_K;
      q6 = q6 || qtypes[j] == tandem_gguf::Q6_K;
    }
    start[j + 1] = start[j] + (mine ? tandem_gguf_vnni::prefill_tiles(jobs[j]) : tandem_gguf_vnni::tile_count(jobs[j]));
  }
  const int64_t units = start[count];
  if (units == 0) return true;
  static thread_local Prepared prepared;  // each calling thread its own
  if (in != nullptr) prepare(*in, M, prepared, q6, q4);
  const Prepared& p = prepared;
  at::parallel_for(0, units, 1, [&](int64_t u0, int64_t u1) {
    std::unique_ptr<Scratch> s(new Scratch);
    s->storage.resize(p.chunks * kWide * kRows + 16);
    s->acc = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(s->storage.data()) + 63) & ~uintptr_t(63));
    bool configured = false;
    int64_t j = 0;
    for (int64_t u = u0; u < u1; ++u) {
      while (u >= start[j + 1]) ++j;
      const int64_t t = u - start[j];
      const bool is_q4 = qtypes[j] == tandem_gguf::Q4_K, is_q6 = qtypes[j] == tandem_gguf::Q6_K;
      if ((is_q4 || is_q6) && !configured) {
        configure();  // per thread: at::parallel_for's threads each have their own tile state
        configured = true;
      }
      if (is_q4) amx_tile<false>(jobs[j], p, t, *s);
      else if (is_q6) amx_tile<true>(jobs[j], p, t, *s);
      else tandem_gguf_vnni::column_of(qtypes[j], jobs[j], t, M);
    }
    if (configured) _tile_release();  // the thread's tile state back to its initial one
  });
  return true;
}

}  // namespace tandem_gguf_amx

#pragma GCC pop_options
