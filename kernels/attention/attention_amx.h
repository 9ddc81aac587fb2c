// A key chunk's partial softmax on AMX-BF16 tiles, for a 16-bit (fp16) cache: what the 16-lane
// partials compute, with the multiply-adds on the tile unit, which does in one instruction the
// 8,192 multiply-adds the FMA units take 256 for. A verification's extra rows then cost about
// what reading and widening the cache costs, which all rows share, instead of 16 multiply-adds
// per key and query.
//
// Accuracy: the tiles multiply bf16 numbers (8 significant bits) and add in fp32. Each operand
// is split in two bf16 parts, x = hi + lo with hi its top 8 bits, and the four products
// hi.hi + hi.lo + lo.hi + lo.lo accumulated: an fp16 key or value (11 bits) splits exactly, a
// query or probability (fp32) to within 2^-17 of itself, so scores and outputs stay at fp32's
// grade (the textbook tests' 1e-5), where one bf16 product would round at 2^-9 (llama.cpp's
// fp16 dot products round their query at 2^-11).
//
// Batch invariance: a C tile's element is computed from its A row and B column alone, in a
// fixed order (the four products per 32 dims or keys, the dims or keys in order), so a query's
// scores and output do not depend on which queries share its tile, nor on how many. Keys past
// the chunk's visible end are zeros in the tiles and -inf in the scores, so a partly visible
// chunk gives every query the bits it gives the query alone.
//
// Layout (B tiles: 16 rows of 16 column pairs): the scores S = Q K^T take Q as A (16 queries x
// 32 dims) and K^T as B (dim pairs x 16 keys, a 16 x 16 transpose of the cache's fp16 pairs);
// the output O = P V takes P as A (16 queries x 32 keys, the softmax's rows as they are) and V
// as B (key pairs x 16 dims: two keys' rows interleaved). A chunk's keys and values are laid out
// once for every group of 16 queries that reads them.
#pragma once
#include <immintrin.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <cpuid.h>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace tandem_attention_amx {

// AMX-BF16 (and AVX512-BF16 for the conversions) where Linux lets this process use the tiles'
// state: the kernel refuses a tile instruction until the process asks for XTILEDATA, once.
inline bool cpu_has_amx_bf16() {
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!(d & (1u << 22)) || !(d & (1u << 24))) return false;  // AMX-BF16, AMX-TILE
    if (!__builtin_cpu_supports("avx512bf16") || !__builtin_cpu_supports("avx512bw")) return false;
#ifdef SYS_arch_prctl
    constexpr int kReqXcompPerm = 0x1023, kXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
#else
    return false;
#endif
  }();
  return has;
}

// TANDEM_AMX=0 turns the tiles off (the 16-lane partials run), to measure both on one machine.
inline bool& amx_enabled() {
  static bool on = [] {
    const char* env = std::getenv("TANDEM_AMX");
    return env == nullptr || std::string(env) != "0";
  }();
  return on;
}

constexpr int64_t kKeys = 256;  // a chunk's keys (the kernel's kChunk)
constexpr int kQueries = 16;    // queries per tile

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,f16c,fma,amx-tile,amx-bf16")

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {0};
  uint16_t colsb[16] = {0};
  uint8_t rows[16] = {0};
};

// Every tile 16 rows of 64 bytes. C: 0 and 1; A: 2 (hi) and 3 (lo); B: 4-7.
inline void configure() {
  TileConfig cfg;
  for (int i = 0; i < 8; ++i) cfg.rows[i] = 16, cfg.colsb[i] = 64;
  asm volatile("" ::: "memory");  // ldtilecfg's operand names only the config's first bytes
  _tile_loadconfig(&cfg);
}

inline void release() { _tile_release(); }

inline __m512i hi_mask() { return _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)); }

// 32 fp32 values (x0: the first 16) -> their top halves (bf16 truncations, exact) in order.
inline __m512i top_halves(__m512 x0, __m512 x1) {
  static const __m512i odd = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27,
                                              25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  return _mm512_permutex2var_epi16(_mm512_castps_si512(x0), odd, _mm512_castps_si512(x1));
}

inline __m512 truncated(__m512 x) { return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), hi_mask())); }

// 32 fp32 values -> (hi, lo) bf16 rows: hi their top 8 bits, lo the rest rounded to bf16.
inline void split_row(__m512 x0, __m512 x1, uint16_t* hi, uint16_t* lo) {
  _mm512_storeu_si512(hi, top_halves(x0, x1));
  const __m512bh rest = _mm512_cvtne2ps_pbh(_mm512_sub_ps(x1, truncated(x1)), _mm512_sub_ps(x0, truncated(x0)));
  _mm512_storeu_si512(lo, (__m512i)rest);
}

// 16 x 16 32-bit elements transposed in registers (r[i] row i -> r[j] column j).
inline void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]), t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]), u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]), u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // u[4b + c]: rows 4b..4b+3, columns c, c+4, c+8, c+12 (one per 128-bit lane).
  for (int c = 0; c < 4; ++c) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88), v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xDD);
    const __m512i w0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88), w1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xDD);
    r[c] = _mm512_shuffle_i32x4(v0, w0, 0x88), r[c + 8] = _mm512_shuffle_i32x4(v0, w0, 0xDD);
    r[c + 4] = _mm512_shuffle_i32x4(v1, w1, 0x88), r[c + 12] = _mm512_shuffle_i32x4(v1, w1, 0xDD);
  }
}

constexpr int64_t kTile = 512;  // bf16 values in a 16 x 64-byte tile

// One chunk's keys and values as B tiles (each a hi and a lo part), for n keys of the chunk
// (zeros past them): K^T tile (kt, ds) for keys 16 kt.., dims 32 ds..; V tile (ks, dt) for keys
// 32 ks.., dims 16 dt...
struct ChunkTiles {
  std::vector<uint16_t> k, v;  // [key tile][dim step][hi, lo][512], [key step][dim tile][hi, lo][512]
  int64_t n = 0, key_tiles = 0, key_steps = 0, dim_steps = 0, dim_tiles = 0;
  const uint16_t* kt(int64_t t, int64_t ds) const { return k.data() + ((t * dim_steps + ds) * 2) * kTile; }
  const uint16_t* vt(int64_t s, int64_t dt) const { return v.data() + ((s * dim_tiles + dt) * 2) * kTile; }
};

// kh / vh: the KV head's rows (fp16, kv_pos apart), from the chunk's first key; n keys of it.
inline void lay_out(const uint16_t* kh, const uint16_t* vh, int64_t kv_pos, int64_t D, int64_t n, ChunkTiles& c) {
  c.n = n, c.key_tiles = (n + 15) / 16, c.key_steps = (n + 31) / 32, c.dim_steps = D / 32, c.dim_tiles = D / 16;
  c.k.resize(static_cast<size_t>(16 * c.dim_steps * 2 * kTile));
  c.v.resize(static_cast<size_t>(8 * c.dim_tiles * 2 * kTile));
  for (int64_t t = 0; t < c.key_tiles; ++t)
    for (int64_t ds = 0; ds < c.dim_steps; ++ds) {
      __m512i r[16];  // row j: key 16 t + j's dims 32 ds.. as 16 fp16 pairs
      for (int j = 0; j < 16; ++j) {
        const int64_t key = 16 * t + j;
        r[j] = key < n ? _mm512_loadu_si512(kh + key * kv_pos + 32 * ds) : _mm512_setzero_si512();
      }
      transpose16(r);  // row p: dims (2p, 2p + 1) of the 16 keys
      uint16_t* hi = c.k.data() + ((t * c.dim_steps + ds) * 2) * kTile;
      for (int p = 0; p < 16; ++p) {
        const __m512 x0 = _mm512_cvtph_ps(_mm512_castsi512_si256(r[p]));
        const __m512 x1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(r[p], 1));
        _mm512_storeu_si512(hi + 32 * p, top_halves(x0, x1));
        _mm512_storeu_si512(hi + kTile + 32 * p, top_halves(_mm512_sub_ps(x0, truncated(x0)), _mm512_sub_ps(x1, truncated(x1))));
      }
    }
  const __mmask32 odd_words = 0xAAAAAAAAu;
  for (int64_t s = 0; s < c.key_steps; ++s)
    for (int64_t dt = 0; dt < c.dim_tiles; ++dt) {
      uint16_t* hi = c.v.data() + ((s * c.dim_tiles + dt) * 2) * kTile;
      for (int p = 0; p < 16; ++p) {  // keys 32 s + 2p and the next, 16 dims side by side
        const int64_t key = 32 * s + 2 * p;
        const __m512 v0 = key < n ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vh + key * kv_pos + 16 * dt)))
                                  : _mm512_setzero_ps();
        const __m512 v1 = key + 1 < n
                              ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vh + (key + 1) * kv_pos + 16 * dt)))
                              : _mm512_setzero_ps();
        const __m512i h = _mm512_mask_blend_epi16(odd_words, _mm512_srli_epi32(_mm512_castps_si512(v0), 16), _mm512_castps_si512(v1));
        const __m512 l0 = _mm512_sub_ps(v0, truncated(v0)), l1 = _mm512_sub_ps(v1, truncated(v1));
        const __m512i l = _mm512_mask_blend_epi16(odd_words, _mm512_srli_epi32(_mm512_castps_si512(l0), 16), _mm512_castps_si512(l1));
        _mm512_storeu_si512(hi + 32 * p, h);
        _mm512_storeu_si512(hi + kTile + 32 * p, l);
      }
    }
}

// Per-thread scratch for one group of up to 16 queries.
struct Scratch {
  std::vector<uint16_t> q;      // [hi, lo][16][D]
  std::vector<uint16_t> p;      // [hi, lo][16][kKeys]
  std::vector<float> scores;    // [16][kKeys]
  std::vector<float> out;       // [16][D]
  void size(int64_t D) {
    q.resize(static_cast<size_t>(2 * kQueries * D));
    p.resize(static_cast<size_t>(2 * kQueries * kKeys));
    scores.resize(static_cast<size_t>(kQueries * kKeys));
    out.resize(static_cast<size_t>(kQueries * D));
  }
};

inline float hmax16(__m512 v) { return _mm512_reduce_max_ps(v); }

// exp on 16 lanes: the 8-lane exp on each half (the same bits as the other partials' exp).
inline __m512 exp16(__m512 x) {
  const __m256 lo = tandem_avx2::exp256(_mm512_castps512_ps256(x)), hi = tandem_avx2::exp256(_mm512_extractf32x8_ps(x, 1));
  return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}

// The queries' rows for the A tiles: q[n] * scaling split in hi and lo bf16, rows past nq zero.
template <typename QT>
inline void load_queries(int nq, const QT* const* qs, float scaling, int64_t D, Scratch& w) {
  uint16_t* hi = w.q.data();
  uint16_t* lo = hi + kQueries * D;
  const __m512 scale = _mm512_set1_ps(scaling);
  for (int r = 0; r < kQueries; ++r)
    for (int64_t d = 0; d < D; d += 32) {
      if (r >= nq) {
        _mm512_storeu_si512(hi + r * D + d, _mm512_setzero_si512());
        _mm512_storeu_si512(lo + r * D + d, _mm512_setzero_si512());
        continue;
      }
      alignas(64) float x[32];
      for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(qs[r][d + i]);
      split_row(_mm512_mul_ps(_mm512_load_ps(x), scale), _mm512_mul_ps(_mm512_load_ps(x + 16), scale), hi + r * D + d, lo + r * D + d);
    }
}

// The chunk's partials for nq <= 16 queries (loaded by load_queries): for query r, a[r][D]
// (unnormalized), m[r] and l[r]. Tiles configured by the caller's thread.
inline void partials(int nq, const ChunkTiles& c, int64_t D, Scratch& w, float* const* a, float* m_out, float* l_out) {
  const uint16_t* qh = w.q.data();
  const uint16_t* ql = qh + kQueries * D;
  float* scores = w.scores.data();
  // Scores, two key tiles at a time (C 0 and 1), the four products per 32 dims in fixed order.
  for (int64_t t = 0; t < c.key_tiles; t += 2) {
    const bool two = t + 1 < c.key_tiles;
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t ds = 0; ds < c.dim_steps; ++ds) {
      _tile_loadd(2, qh + 32 * ds, D * 2);
      _tile_loadd(3, ql + 32 * ds, D * 2);
      _tile_loadd(4, c.kt(t, ds), 64);
      _tile_loadd(5, c.kt(t, ds) + kTile, 64);
      _tile_dpbf16ps(0, 2, 4);
      _tile_dpbf16ps(0, 2, 5);
      _tile_dpbf16ps(0, 3, 4);
      _tile_dpbf16ps(0, 3, 5);
      if (two) {
        _tile_loadd(6, c.kt(t + 1, ds), 64);
        _tile_loadd(7, c.kt(t + 1, ds) + kTile, 64);
        _tile_dpbf16ps(1, 2, 6);
        _tile_dpbf16ps(1, 2, 7);
        _tile_dpbf16ps(1, 3, 6);
        _tile_dpbf16ps(1, 3, 7);
      }
    }
    _tile_stored(0, scores + 16 * t, kKeys * 4);
    if (two) _tile_stored(1, scores + 16 * (t + 1), kKeys * 4);
  }
  // Softmax partials per query, 16 keys at a time; keys past n are -inf (exp 0).
  const int64_t padded = 16 * c.key_tiles;
  uint16_t* ph = w.p.data();
  uint16_t* pl = ph + kQueries * kKeys;
  for (int r = 0; r < kQueries; ++r) {
    float* sc = scores + r * kKeys;
    if (r >= nq) {  // rows the tile computes for no query: zero probabilities
      for (int64_t j = 0; j < 32 * c.key_steps; j += 32) {
        _mm512_storeu_si512(ph + r * kKeys + j, _mm512_setzero_si512());
        _mm512_storeu_si512(pl + r * kKeys + j, _mm512_setzero_si512());
      }
      continue;
    }
    for (int64_t j = c.n; j < padded; ++j) sc[j] = -INFINITY;
    __m512 mv = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < padded; j += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(sc + j));
    const float mx = hmax16(mv);
    mv = _mm512_set1_ps(mx);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < padded; j += 16) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sc + j), mv));
      _mm512_storeu_ps(sc + j, e);
      sum = _mm512_add_ps(sum, e);
    }
    for (int64_t j = padded; j < 32 * c.key_steps; ++j) sc[j] = 0.0f;
    m_out[r] = mx;
    l_out[r] = tandem_avx2::hsum(_mm256_add_ps(_mm512_castps512_ps256(sum), _mm512_extractf32x8_ps(sum, 1)));
    for (int64_t j = 0; j < 32 * c.key_steps; j += 32)
      split_row(_mm512_loadu_ps(sc + j), _mm512_loadu_ps(sc + j + 16), ph + r * kKeys + j, pl + r * kKeys + j);
  }
  // Values, two dim tiles at a time.
  float* out = w.out.data();
  for (int64_t dt = 0; dt < c.dim_tiles; dt += 2) {
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t s = 0; s < c.key_steps; ++s) {
      _tile_loadd(2, ph + 32 * s, kKeys * 2);
      _tile_loadd(3, pl + 32 * s, kKeys * 2);
      _tile_loadd(4, c.vt(s, dt), 64);
      _tile_loadd(5, c.vt(s, dt) + kTile, 64);
      _tile_loadd(6, c.vt(s, dt + 1), 64);
      _tile_loadd(7, c.vt(s, dt + 1) + kTile, 64);
      _tile_dpbf16ps(0, 2, 4);
      _tile_dpbf16ps(0, 2, 5);
      _tile_dpbf16ps(0, 3, 4);
      _tile_dpbf16ps(0, 3, 5);
      _tile_dpbf16ps(1, 2, 6);
      _tile_dpbf16ps(1, 2, 7);
      _tile_dpbf16ps(1, 3, 6);
      _tile_dpbf16ps(1, 3, 7);
    }
    _tile_stored(0, out + 16 * dt, D * 4);
    _tile_stored(1, out + 16 * (dt + 1), D * 4);
  }
  for (int r = 0; r < nq; ++r)
    for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(a[r] + d, _mm512_loadu_ps(out + r * D + d));
}

#pragma GCC pop_options

}  // namespace tandem_attention_amx
