// The batch-invariant causal attention itself (see attention_avx2.cpp for why and how), in a
// header so that every kernel attending over a cache computes it the same way: the attention
// kernel the GGUF and transformers runners call, and the fused drafter layer
// (kernels/draft_decoder), which attends inside its one call per layer.
#pragma once
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "avx2_common.h"

namespace tandem_attention {

constexpr int64_t kChunk = 256;  // keys per partial softmax (fixed: it sets the arithmetic)

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::BFloat16* p) { return tandem_avx2::load_bf16x8(reinterpret_cast<const uint16_t*>(p)); }
inline __m256 load8(const at::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
using tandem_avx2::exp256;
using tandem_avx2::hmax;
using tandem_avx2::hsum;

struct Shape {
  int64_t Q, H, KVH, L, D;
  int64_t q_row, q_head;           // query strides (elements)
  int64_t kv_head, kv_pos;         // key / value strides
  float scaling;
  int64_t visible(int64_t i) const { return L - Q + i + 1; }  // causal: the cache and rows up to i
};

// Lane j of the result is the sum of the 8 lanes of s[j] in one fixed order, ((0+1)+(2+3)) +
// ((4+5)+(6+7)): 4 keys' scores.
inline __m128 hsum4(const __m256 s[4]) {
  const __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(s[0], s[1]), _mm256_hadd_ps(s[2], s[3]));
  return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

// Each query's scores (rows of ``scores``, ``padded`` of them, -inf past the chunk's keys) ->
// exp(s - m) in place, with m = their max and l = the sum of the exponentials, 8 at a time.
inline void softmax_partials(int nq, float* scores, int64_t row, int64_t padded, float* m_out, float* l_out) {
  for (int q = 0; q < nq; ++q) {
    float* sc = scores + q * row;
    __m256 mv = _mm256_set1_ps(-INFINITY);
    for (int64_t j = 0; j < padded; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(sc + j));
    const float m = hmax(mv);
    mv = _mm256_set1_ps(m);
    __m256 sum8 = _mm256_setzero_ps();
    for (int64_t j = 0; j < padded; j += 8) {
      const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sc + j), mv));
      _mm256_storeu_ps(sc + j, e);
      sum8 = _mm256_add_ps(sum8, e);
    }
    m_out[q] = m;
    l_out[q] = hsum(sum8);
  }
}

// The values' part of a chunk's partials for head_dim d0 .. d0 + 8 WW: a[q][d] = the sum over
// the chunk's keys j, in key order, of p[q][j] * V[j][d], with p the exponentials in ``scores``.
// A function of its own for each width, its accumulators in registers: an array indexed by a
// width known only at run time is kept in memory, and the loop then stores every accumulator
// on every key (measured: half the kernel's rate).
template <int NQ, int WW, typename KT>
inline void value_slice(const KT* vh, const Shape& s, int64_t j0, int64_t n, int64_t d0, const float* scores, int64_t row,
                        float* const* a) {
  __m256 acc[NQ][WW];
  for (int q = 0; q < NQ; ++q)
    for (int c = 0; c < WW; ++c) acc[q][c] = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const KT* vr = vh + (j0 + j) * s.kv_pos + d0;
    __m256 vv[WW];
    for (int c = 0; c < WW; ++c) vv[c] = load8(vr + 8 * c);
    for (int q = 0; q < NQ; ++q) {
      const __m256 p = _mm256_broadcast_ss(scores + q * row + j);
      for (int c = 0; c < WW; ++c) acc[q][c] = _mm256_fmadd_ps(p, vv[c], acc[q][c]);
    }
  }
  for (int q = 0; q < NQ; ++q)
    for (int c = 0; c < WW; ++c) _mm256_storeu_ps(a[q] + d0 + 8 * c, acc[q][c]);
}

// NQ query vectors (heads of one KV group, rows that see the same keys) against one chunk of
// keys [j0, j1): each key and value row is loaded (and widened from 16 bits) once for all NQ,
// and every query's arithmetic is the one a query computed alone does (its FMAs in the same
// order, the same reduction tree), so grouping changes no bit of any result. For query n it
// writes a[n][D] (unnormalized) and (m[n], l[n]). scores: NQ x (kChunk + 8); qf: NQ x D.
//
// Registers (16): scores take NQ x KB accumulators, KB keys widened and one query vector; values
// NQ x W accumulators, W value vectors and one weight. Up to two queries, 4 keys / 4 vectors;
// more, 2 and 2 (6 queries: 12 accumulators + 3), so that a chunk's keys and values are loaded
// and widened once per 6 queries, not per 2 (1.2-1.3x the pairs' rate on a Zen 3 core, the
// drafter's 7 heads a KV head 1.4x).
//
// ``prefetch``: the first group to read a chunk finds it in memory, not in L2, and the hardware's
// prefetchers stop at every 4 KB page (16 keys of 128 fp16 values): it asks for the keys 32 rows
// ahead (into the next chunk, which the same thread usually takes next) and for the values of the
// keys it scores, which the value pass reads next. In the target's step at 4,096 cached tokens
// the 28 layers' attention took 7.5-8.5 ms with it, 10-11.5 without (16 and 64 rows ahead: no better).
template <int NQ, typename QT, typename KT>
inline void chunk_partials(const QT* const* qs, const KT* kh, const KT* vh, const Shape& s, int64_t j0, int64_t j1,
                           float* scores, float* qf, float* const* a, float* m_out, float* l_out, bool prefetch) {
  constexpr int64_t kAhead = 32;
  const int64_t row_bytes = s.D * static_cast<int64_t>(sizeof(KT));
  constexpr int KB = NQ <= 2 ? 4 : 2;
  constexpr int W = NQ <= 2 ? 4 : 2;
  const int64_t D = s.D, n = j1 - j0, row = kChunk + 8;
  const __m256 scale = _mm256_set1_ps(s.scaling);
  for (int q = 0; q < NQ; ++q)
    for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(qf + q * D + d, _mm256_mul_ps(load8(qs[q] + d), scale));
  const int64_t padded = (n + 7) & ~int64_t(7);
  // Scores 4 keys at a time for every query (each key's dot product in 8 lanes over head_dim,
  // then one fixed hadd tree for 4 keys), KB keys per pass over head_dim.
  for (int64_t j = 0; j < padded; j += 4) {
    __m256 sums[NQ][4];
    const int64_t here = std::max<int64_t>(0, std::min<int64_t>(4, n - j));
    if (prefetch)
      for (int64_t key = j0 + j; key < std::min(j0 + j + 4, s.L); ++key) {
        const char* v_now = reinterpret_cast<const char*>(vh + key * s.kv_pos);
        for (int64_t b = 0; b < row_bytes; b += 64) _mm_prefetch(v_now + b, _MM_HINT_T1);
        if (key + kAhead >= s.L) continue;
        const char* k_ahead = reinterpret_cast<const char*>(kh + (key + kAhead) * s.kv_pos);
        for (int64_t b = 0; b < row_bytes; b += 64) _mm_prefetch(k_ahead + b, _MM_HINT_T0);
      }
    for (int c0 = 0; c0 < 4; c0 += KB) {
      __m256 acc[NQ][KB];
      for (int q = 0; q < NQ; ++q)
        for (int c = 0; c < KB; ++c) acc[q][c] = _mm256_setzero_ps();
      const int64_t left = std::max<int64_t>(0, std::min<int64_t>(KB, here - c0));
      const KT* k0 = kh + (j0 + j + c0) * s.kv_pos;
      if (left == KB) {
        for (int64_t d = 0; d < D; d += 8) {
          __m256 kv[KB];
          for (int c = 0; c < KB; ++c) kv[c] = load8(k0 + c * s.kv_pos + d);
          for (int q = 0; q < NQ; ++q) {
            __m256 qv = _mm256_loadu_ps(qf + q * D + d);
            asm("" : "+x"(qv));  // one load for KB keys: folded into each FMA it would be KB
            for (int c = 0; c < KB; ++c) acc[q][c] = _mm256_fmadd_ps(qv, kv[c], acc[q][c]);
          }
        }
      } else {
        for (int64_t d = 0; d < D; d += 8) {
          for (int c = 0; c < left; ++c) {
            const __m256 kv = load8(k0 + c * s.kv_pos + d);
            for (int q = 0; q < NQ; ++q) acc[q][c] = _mm256_fmadd_ps(_mm256_loadu_ps(qf + q * D + d), kv, acc[q][c]);
          }
        }
      }
      for (int q = 0; q < NQ; ++q)
        for (int c = 0; c < KB; ++c) sums[q][c0 + c] = acc[q][c];
    }
    for (int q = 0; q < NQ; ++q) {
      __m128 x = hsum4(sums[q]);
      if (here < 4) {  // keys past the chunk's end: -inf, whose exp is 0
        alignas(16) float tmp[4];
        _mm_store_ps(tmp, x);
        for (int c = static_cast<int>(here); c < 4; ++c) tmp[c] = -INFINITY;
        x = _mm_load_ps(tmp);
      }
      _mm_storeu_ps(scores + q * row + j, x);
    }
  }
  softmax_partials(NQ, scores, row, padded, m_out, l_out);
  // Values key by key (rows of V are contiguous), W vectors of head_dim for every query at a
  // time (a last 8 values alone where W does not divide head_dim).
  int64_t d0 = 0;
  for (; d0 + 8 * W <= D; d0 += 8 * W) value_slice<NQ, W>(vh, s, j0, n, d0, scores, row, a);
  for (; d0 < D; d0 += 8) value_slice<NQ, 1>(vh, s, j0, n, d0, scores, row, a);
}

// The same partials 16 lanes at a time, where the CPU has AVX-512 (and head_dim is a multiple
// of 16): half the multiply-adds for the scores and the values, which bind a verification over a
// long cache. Its own fixed reduction tree (each score's 16 lanes folded to 8, then hsum4), so its
// bits differ from the 8-lane tiles' but not between calls: a process uses one tile set for every
// row it computes.
// It repeats chunk_partials' structure rather than sharing a template with it: the AVX-512
// intrinsics compile only inside this target region, and GCC cannot give one instantiation of a
// template other target options than another (the avx2 build must not need AVX-512).
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const at::BFloat16* p) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}
inline __m512 load16(const at::Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

inline __m256 fold16(__m512 x) {
  return _mm256_add_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1));
}

template <int NQ, typename QT, typename KT>
__attribute__((noinline)) void chunk_partials16(const QT* const* qs, const KT* kh, const KT* vh, const Shape& s, int64_t j0,
                                                int64_t j1, float* scores, float* qf, float* const* a, float* m_out, float* l_out) {
  const int64_t D = s.D, n = j1 - j0, row = kChunk + 8;
  const __m512 scale = _mm512_set1_ps(s.scaling);
  for (int q = 0; q < NQ; ++q)
    for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(qf + q * D + d, _mm512_mul_ps(load16(qs[q] + d), scale));
  const int64_t padded = (n + 7) & ~int64_t(7);
  for (int64_t j = 0; j < padded; j += 4) {
    __m512 acc[NQ][4];
    for (int q = 0; q < NQ; ++q)
      for (int c = 0; c < 4; ++c) acc[q][c] = _mm512_setzero_ps();
    const int64_t here = std::max<int64_t>(0, std::min<int64_t>(4, n - j));
    if (here == 4) {
      // The 4 keys' vectors widened once, each query's vector loaded once for them: a memory
      // operand folded into every FMA would be 4 loads of it, and one 512-bit load a cycle is
      // what a Zen 4 core's L1 serves (measured: a 5-row verification's attention at 4,096
      // cached tokens bound by those loads). Each accumulator's FMAs keep their order.
      for (int64_t d = 0; d < D; d += 16) {
        __m512 kv[4];
        for (int c = 0; c < 4; ++c) kv[c] = load16(kh + (j0 + j + c) * s.kv_pos + d);
        for (int q = 0; q < NQ; ++q) {
          __m512 qv = _mm512_loadu_ps(qf + q * D + d);
          asm("" : "+v"(qv));
          for (int c = 0; c < 4; ++c) acc[q][c] = _mm512_fmadd_ps(qv, kv[c], acc[q][c]);
        }
      }
    } else {
      for (int64_t d = 0; d < D; d += 16) {
        for (int c = 0; c < here; ++c) {
          const __m512 kv = load16(kh + (j0 + j + c) * s.kv_pos + d);
          for (int q = 0; q < NQ; ++q) acc[q][c] = _mm512_fmadd_ps(_mm512_loadu_ps(qf + q * D + d), kv, acc[q][c]);
        }
      }
    }
    for (int q = 0; q < NQ; ++q) {
      const __m256 folded[4] = {fold16(acc[q][0]), fold16(acc[q][1]), fold16(acc[q][2]), fold16(acc[q][3])};
      __m128 x = hsum4(folded);
      if (here < 4) {  // keys past the chunk's end: -inf, whose exp is 0
        alignas(16) float tmp[4];
        _mm_store_ps(tmp, x);
        for (int c = static_cast<int>(here); c < 4; ++c) tmp[c] = -INFINITY;
        x = _mm_load_ps(tmp);
      }
      _mm_storeu_ps(scores + q * row + j, x);
    }
  }
  softmax_partials(NQ, scores, row, padded, m_out, l_out);
  for (int64_t d0 = 0; d0 < D; d0 += 64) {
    const int width = static_cast<int>(std::min<int64_t>(64, D - d0) / 16);
    __m512 acc[NQ][4];
    for (int q = 0; q < NQ; ++q)
      for (int c = 0; c < 4; ++c) acc[q][c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      const KT* vr = vh + (j0 + j) * s.kv_pos + d0;
      __m512 p[NQ];
      for (int q = 0; q < NQ; ++q) p[q] = _mm512_set1_ps(scores[q * row + j]);
      for (int c = 0; c < width; ++c) {
        const __m512 vv = load16(vr + 16 * c);
        for (int q = 0; q < NQ; ++q) acc[q][c] = _mm512_fmadd_ps(p[q], vv, acc[q][c]);
      }
    }
    for (int q = 0; q < NQ; ++q)
      for (int c = 0; c < width; ++c) _mm512_storeu_ps(a[q] + d0 + 16 * c, acc[q][c]);
  }
}

#pragma GCC pop_options

// Whether the 16-lane partials run: where the CPU has the AVX-512 tile set the other kernels use
// (AVX-512 with VNNI) and TANDEM_AVX512 does not turn it off (tests switch it to compare both on
// one machine).
inline bool& avx512_enabled() {
  static bool on = tandem_avx2::avx512_allowed_by_env() && tandem_avx2::cpu_has_avx512_vnni();
  return on;
}

// Queries sharing each loaded key and value: up to 6 in both tile sets (a grouped-query model's
// 6 heads of one KV head at once, so a chunk's keys and values pass from L2 a third as often as
// in pairs). kMaxGroup sizes the buffers.
constexpr int kMaxGroup = 6;

inline bool sixteen_lanes(const Shape& s) { return avx512_enabled() && s.D % 16 == 0; }

template <typename QT, typename KT>
inline void chunk_partials_any(int nq, const QT* const* qs, const KT* kh, const KT* vh, const Shape& s, int64_t j0,
                               int64_t j1, float* scores, float* qf, float* const* a, float* m, float* l,
                               bool prefetch = false) {
  if (sixteen_lanes(s)) {
    switch (nq) {
      case 6: chunk_partials16<6>(qs, kh, vh, s, j0, j1, scores, qf, a, m, l); return;
      case 5: chunk_partials16<5>(qs, kh, vh, s, j0, j1, scores, qf, a, m, l); return;
      case 4: chunk_partials16<4>(qs, kh, vh, s, j0, j1, scores, qf, a, m, l); return;
      case 3: chunk_partials16<3>(qs, kh, vh, s, j0, j1, scores, qf, a, m, l); return;
      case 2: chunk_partials16<2>(qs, kh, vh, s, j0, j1, scores, qf, a, m, l); return;
      default: chunk_partials16<1>(qs, kh, vh, s, j0, j1, scores, qf, a, m, l); return;
    }
  }
  switch (nq) {
    case 6: chunk_partials<6>(qs, kh, vh, s, j0, j1, scores, qf, a, m, l, prefetch); return;
    case 5: chunk_partials<5>(qs, kh, vh, s, j0, j1, scores, qf, a, m, l, prefetch); return;
    case 4: chunk_partials<4>(qs, kh, vh, s, j0, j1, scores, qf, a, m, l, prefetch); return;
    case 3: chunk_partials<3>(qs, kh, vh, s, j0, j1, scores, qf, a, m, l, prefetch); return;
    case 2: chunk_partials<2>(qs, kh, vh, s, j0, j1, scores, qf, a, m, l, prefetch); return;
    default: chunk_partials<1>(qs, kh, vh, s, j0, j1, scores, qf, a, m, l, prefetch); return;
  }
}

// q [Q, H, D] rows (strided), k/v [KVH, L, D] (strided), out [Q, H, D] contiguous.
template <typename QT, typename KT>
void attend(const QT* q, const KT* k, const KT* v, QT* out, const Shape& s) {
  const int64_t group = s.H / s.KVH, D = s.D;
  // Chunks 0 .. shared_chunks - 1 are whole for every row (row 0 sees the fewest keys); their
  // partials, partial[i][h][c] = (m, l, a[D]), come from pass 1. A row's later chunks (the last,
  // partly visible ones) are computed in the merge pass.
  const int64_t stride = D + 2;
  const int64_t shared_chunks = s.visible(0) / kChunk;
  const int64_t row = kChunk + 8;
  // Not zeroed: pass 1 writes every entry pass 2 reads.
  std::unique_ptr<float[]> partial(new float[static_cast<size_t>(std::max<int64_t>(1, s.Q * s.H * shared_chunks * stride))]);
  auto slot = [&](int64_t i, int64_t h, int64_t c) { return partial.get() + ((i * s.H + h) * shared_chunks + c) * stride; };
  // Pass 1: the chunks every row sees whole, cut by (KV head, chunk): each unit reads its keys
  // and values once for every query head of the group and every row, kMaxGroup queries at a time.
  at::parallel_for(0, s.KVH * shared_chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(kMaxGroup * row), qf(kMaxGroup * D);
    for (int64_t u = begin; u < end; ++u) {
      const int64_t g = u / shared_chunks, c = u % shared_chunks;
      const KT* kh = k + g * s.kv_head;
      const KT* vh = v + g * s.kv_head;
      const int64_t total = s.Q * group;  // (row, head) pairs of this KV head
      for (int64_t t = 0; t < total; t += kMaxGroup) {
        const int nq = static_cast<int>(std::min<int64_t>(kMaxGroup, total - t));
        const QT* qs[kMaxGroup];
        float* as[kMaxGroup];
        float ms[kMaxGroup], ls[kMaxGroup];
        for (int n = 0; n < nq; ++n) {
          const int64_t i = (t + n) / group, h = g * group + (t + n) % group;
          qs[n] = q + i * s.q_row + h * s.q_head;
          as[n] = slot(i, h, c) + 2;
        }
        chunk_partials_any(nq, qs, kh, vh, s, c * kChunk, (c + 1) * kChunk, scores.data(), qf.data(), as, ms, ls, t == 0);
        for (int n = 0; n < nq; ++n) {
          const int64_t i = (t + n) / group, h = g * group + (t + n) % group;
          slot(i, h, c)[0] = ms[n], slot(i, h, c)[1] = ls[n];
        }
      }
    }
  });
  // Pass 2: per (row, up to kMaxGroup heads of one KV group), the remaining chunks (the last, partly
  // visible ones: the heads of a row see the same keys), merged with the shared partials in
  // chunk order, each head alone.
  const int64_t parts_per_group = (group + kMaxGroup - 1) / kMaxGroup;
  at::parallel_for(0, s.Q * s.KVH * parts_per_group, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(kMaxGroup * row), qf(kMaxGroup * D), a(kMaxGroup * D), acc(kMaxGroup * D);
    for (int64_t idx = begin; idx < end; ++idx) {
      const int64_t i = idx / (s.KVH * parts_per_group), rest = idx % (s.KVH * parts_per_group);
      const int64_t g = rest / parts_per_group, h0 = g * group + (rest % parts_per_group) * kMaxGroup;
      const int nq = static_cast<int>(std::min<int64_t>(kMaxGroup, (g + 1) * group - h0));
      const int64_t visible = s.visible(i);
      const int64_t own_chunks = (visible + kChunk - 1) / kChunk;
      const KT* kh = k + g * s.kv_head;
      const KT* vh = v + g * s.kv_head;
      const QT* qs[kMaxGroup];
      float* as[kMaxGroup];
      float M[kMaxGroup], Lsum[kMaxGroup];
      for (int n = 0; n < nq; ++n) qs[n] = q + i * s.q_row + (h0 + n) * s.q_head, as[n] = a.data() + n * D;
      for (int64_t c = 0; c < own_chunks; ++c) {
        float m[kMaxGroup], l[kMaxGroup];
        const float* pa[kMaxGroup];
        if (c < shared_chunks) {
          for (int n = 0; n < nq; ++n) {
            const float* p = slot(i, h0 + n, c);
            m[n] = p[0], l[n] = p[1], pa[n] = p + 2;
          }
        } else {
          chunk_partials_any(nq, qs, kh, vh, s, c * kChunk, std::min(visible, (c + 1) * kChunk), scores.data(), qf.data(),
                             as, m, l);
          for (int n = 0; n < nq; ++n) pa[n] = as[n];
        }
        for (int n = 0; n < nq; ++n) {
          float* acc_n = acc.data() + n * D;
          if (c == 0) {
            M[n] = m[n], Lsum[n] = l[n];
            for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(acc_n + d, _mm256_loadu_ps(pa[n] + d));
            continue;
          }
          const float Mn = std::max(M[n], m[n]);
          const float ea = std::exp(M[n] - Mn), eb = std::exp(m[n] - Mn);
          Lsum[n] = Lsum[n] * ea + l[n] * eb;
          const __m256 va = _mm256_set1_ps(ea), vb = _mm256_set1_ps(eb);
          for (int64_t d = 0; d < D; d += 8) {
            const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(acc_n + d), va);
            _mm256_storeu_ps(acc_n + d, _mm256_fmadd_ps(_mm256_loadu_ps(pa[n] + d), vb, x));
          }
          M[n] = Mn;
        }
      }
      for (int n = 0; n < nq; ++n) {
        const __m256 inv = _mm256_set1_ps(1.0f / Lsum[n]);
        const float* acc_n = acc.data() + n * D;
        QT* o = out + (i * s.H + h0 + n) * D;
        for (int64_t d = 0; d < D; d += 8) {
          alignas(32) float tmp[8];
          _mm256_store_ps(tmp, _mm256_mul_ps(_mm256_loadu_ps(acc_n + d), inv));
          for (int c = 0; c < 8; ++c) o[d + c] = static_cast<QT>(tmp[c]);
        }
      }
    }
  });
}

}  // namespace tandem_attention
