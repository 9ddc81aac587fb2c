// Causal attention of Q new query rows against a KV cache, computed so that a row's result does
// not depend on how many rows are computed together (batch invariance), nor on the thread count.
//
// Speculative verification attends k+1 new rows in one call, plain decoding one row per call, a
// prompt's prefill hundreds; greedy speculation reproduces plain decoding bit for bit, and a
// prefix kept from an earlier request gives what a fresh prefill gives, only if all of them
// compute the same bits for a row. PyTorch's SDPA and matmul-based attention do not: their
// blocking and reduction order change with the number of query rows.
//
// The arithmetic of one (row, head) is fixed by the number of keys it sees and nothing else:
// the keys are cut into chunks of kChunk at fixed positions (0, kChunk, 2 kChunk, ...); each
// chunk gives a partial softmax (its max m, its sum l of exp(s - m), its exp-weighted sum of
// values a), computed in key order; the partials are merged in chunk order. Whether chunks run
// on one thread one after the other or on several at once, the same operations run in the same
// order.
//
// Memory: the work is cut by (KV head, key chunk). One unit reads its chunk's keys and values
// once (from memory into the L2 cache) for every query head of the KV head's group and every
// query row that sees the chunk: a verification of k+1 rows over a long cache reads the cache
// about as often as a one-row step does, where computing each (row, head) pair alone read it
// (heads x rows) times. Long contexts give many units, so two threads split one row's keys.
//
// Scores are 8 keys at a time (8 dot products over head_dim, reduced by a fixed hadd tree), the
// exponentials 8 at a time; keys and values may be fp32, bf16 or fp16 (the cache's format).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "avx2_common.h"

namespace {

constexpr int64_t kChunk = 256;  // keys per partial softmax (fixed: it sets the arithmetic)

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::BFloat16* p) { return tandem_avx2::load_bf16x8(reinterpret_cast<const uint16_t*>(p)); }
inline __m256 load8(const at::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
using tandem_avx2::exp256;
using tandem_avx2::hmax;
using tandem_avx2::hsum;

// Lane j of the result is the sum of the 8 lanes of s[j], in one fixed order.
inline __m256 hsum8(const __m256 s[8]) {
  const __m256 t0 = _mm256_hadd_ps(s[0], s[1]);
  const __m256 t1 = _mm256_hadd_ps(s[2], s[3]);
  const __m256 t2 = _mm256_hadd_ps(s[4], s[5]);
  const __m256 t3 = _mm256_hadd_ps(s[6], s[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1);  // [0a 1a 2a 3a | 0b 1b 2b 3b]
  const __m256 u1 = _mm256_hadd_ps(t2, t3);  // [4a 5a 6a 7a | 4b 5b 6b 7b]
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

struct Shape {
  int64_t Q, H, KVH, L, D;
  int64_t q_row, q_head;           // query strides (elements)
  int64_t kv_head, kv_pos;         // key / value strides
  float scaling;
  int64_t visible(int64_t i) const { return L - Q + i + 1; }  // causal: the cache and rows up to i
};

// One (row, head, chunk) partial: keys [j0, j1). Writes a[D] (unnormalized) and returns (m, l).
template <typename QT, typename KT>
inline void chunk_partial(const QT* qr, const KT* kh, const KT* vh, const Shape& s, int64_t j0, int64_t j1,
                          float* scores, float* qf, float* a, float& m_out, float& l_out) {
  const int64_t D = s.D, n = j1 - j0;
  for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(qf + d, _mm256_mul_ps(load8(qr + d), _mm256_set1_ps(s.scaling)));
  const int64_t padded = (n + 7) & ~int64_t(7);
  __m256 mv = _mm256_set1_ps(-INFINITY);
  for (int64_t j = 0; j < padded; j += 8) {
    __m256 acc[8];
    for (int c = 0; c < 8; ++c) acc[c] = _mm256_setzero_ps();
    const int64_t here = std::min<int64_t>(8, n - j);
    for (int64_t d = 0; d < D; d += 8) {
      const __m256 qv = _mm256_loadu_ps(qf + d);
      for (int c = 0; c < here; ++c) acc[c] = _mm256_fmadd_ps(qv, load8(kh + (j0 + j + c) * s.kv_pos + d), acc[c]);
    }
    __m256 x = hsum8(acc);
    if (here < 8) {  // keys past the chunk's end: -inf, whose exp is 0
      alignas(32) float tmp[8];
      _mm256_store_ps(tmp, x);
      for (int c = here; c < 8; ++c) tmp[c] = -INFINITY;
      x = _mm256_load_ps(tmp);
    }
    _mm256_storeu_ps(scores + j, x);
    mv = _mm256_max_ps(mv, x);
  }
  const float m = hmax(mv);
  mv = _mm256_set1_ps(m);
  __m256 sum8 = _mm256_setzero_ps();
  for (int64_t j = 0; j < padded; j += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(scores + j), mv));
    _mm256_storeu_ps(scores + j, e);
    sum8 = _mm256_add_ps(sum8, e);
  }
  // Values key by key (rows of V are contiguous), 8 vectors of head_dim at a time in registers.
  for (int64_t d0 = 0; d0 < D; d0 += 64) {
    const int64_t width = std::min<int64_t>(64, D - d0) / 8;
    __m256 acc[8];
    for (int c = 0; c < 8; ++c) acc[c] = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      const __m256 p = _mm256_set1_ps(scores[j]);
      const KT* vr = vh + (j0 + j) * s.kv_pos + d0;
      for (int c = 0; c < width; ++c) acc[c] = _mm256_fmadd_ps(p, load8(vr + 8 * c), acc[c]);
    }
    for (int c = 0; c < width; ++c) _mm256_storeu_ps(a + d0 + 8 * c, acc[c]);
  }
  m_out = m;
  l_out = hsum(sum8);
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
  // Not zeroed: pass 1 writes every entry pass 2 reads.
  std::unique_ptr<float[]> partial(new float[static_cast<size_t>(std::max<int64_t>(1, s.Q * s.H * shared_chunks * stride))]);
  // Pass 1: the chunks every row sees whole, cut by (KV head, chunk): each unit reads its keys
  // and values once for every query head of the group and every row.
  at::parallel_for(0, s.KVH * shared_chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(kChunk + 8), qf(D);
    for (int64_t u = begin; u < end; ++u) {
      const int64_t g = u / shared_chunks, c = u % shared_chunks;
      const KT* kh = k + g * s.kv_head;
      const KT* vh = v + g * s.kv_head;
      for (int64_t i = 0; i < s.Q; ++i) {
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          float* p = partial.get() + ((i * s.H + h) * shared_chunks + c) * stride;
          chunk_partial(q + i * s.q_row + h * s.q_head, kh, vh, s, c * kChunk, (c + 1) * kChunk, scores.data(), qf.data(),
                        p + 2, p[0], p[1]);
        }
      }
    }
  });
  // Pass 2: per (row, head), the remaining chunks (the last, partly visible ones), merged with
  // the shared partials in chunk order.
  at::parallel_for(0, s.Q * s.H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(kChunk + 8), qf(D), a(D), acc(D);
    for (int64_t idx = begin; idx < end; ++idx) {
      const int64_t i = idx / s.H, h = idx % s.H, g = h / group;
      const int64_t visible = s.visible(i);
      const int64_t own_chunks = (visible + kChunk - 1) / kChunk;
      const KT* kh = k + g * s.kv_head;
      const KT* vh = v + g * s.kv_head;
      float M = -INFINITY, Lsum = 0.0f;
      for (int64_t c = 0; c < own_chunks; ++c) {
        float m, l;
        const float* pa;
        if (c < shared_chunks) {
          const float* p = partial.get() + ((i * s.H + h) * shared_chunks + c) * stride;
          m = p[0], l = p[1], pa = p + 2;
        } else {
          chunk_partial(q + i * s.q_row + h * s.q_head, kh, vh, s, c * kChunk, std::min(visible, (c + 1) * kChunk),
                        scores.data(), qf.data(), a.data(), m, l);
          pa = a.data();
        }
        if (c == 0) {
          M = m, Lsum = l;
          for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(acc.data() + d, _mm256_loadu_ps(pa + d));
          continue;
        }
        const float Mn = std::max(M, m);
        const float ea = std::exp(M - Mn), eb = std::exp(m - Mn);
        Lsum = Lsum * ea + l * eb;
        const __m256 va = _mm256_set1_ps(ea), vb = _mm256_set1_ps(eb);
        for (int64_t d = 0; d < D; d += 8) {
          const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(acc.data() + d), va);
          _mm256_storeu_ps(acc.data() + d, _mm256_fmadd_ps(_mm256_loadu_ps(pa + d), vb, x));
        }
        M = Mn;
      }
      const __m256 inv = _mm256_set1_ps(1.0f / Lsum);
      QT* o = out + (i * s.H + h) * D;
      for (int64_t d = 0; d < D; d += 8) {
        alignas(32) float tmp[8];
        _mm256_store_ps(tmp, _mm256_mul_ps(_mm256_loadu_ps(acc.data() + d), inv));
        for (int c = 0; c < 8; ++c) o[d + c] = static_cast<QT>(tmp[c]);
      }
    }
  });
}

template <typename QT>
void dispatch_kv(torch::Tensor query, torch::Tensor key, torch::Tensor value, torch::Tensor out, const Shape& s) {
  const QT* q = query.data_ptr<QT>();
  QT* o = out.data_ptr<QT>();
  switch (key.scalar_type()) {
    case at::kFloat: attend<QT, float>(q, key.data_ptr<float>(), value.data_ptr<float>(), o, s); break;
    case at::kBFloat16: attend<QT, at::BFloat16>(q, key.data_ptr<at::BFloat16>(), value.data_ptr<at::BFloat16>(), o, s); break;
    case at::kHalf: attend<QT, at::Half>(q, key.data_ptr<at::Half>(), value.data_ptr<at::Half>(), o, s); break;
    default: TORCH_CHECK(false, "keys and values in fp32, bf16 or fp16 only");
  }
}

}  // namespace

// query [1, H, Q, D], key/value [1, KVH, L, D] (the cache, new rows last); returns [1, Q, H, D]
// in the query's dtype.
torch::Tensor causal_attention(torch::Tensor query, torch::Tensor key, torch::Tensor value, double scaling) {
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4 && query.size(0) == 1, "expects [1, heads, rows, head_dim]");
  TORCH_CHECK(key.strides() == value.strides() && key.sizes() == value.sizes(), "key and value must share a layout");
  TORCH_CHECK(key.scalar_type() == value.scalar_type(), "one dtype for keys and values");
  Shape s;
  s.H = query.size(1), s.Q = query.size(2), s.D = query.size(3);
  s.KVH = key.size(1), s.L = key.size(2);
  TORCH_CHECK(s.H % s.KVH == 0 && s.D % 8 == 0 && key.size(3) == s.D && s.L >= s.Q && s.Q > 0, "unsupported attention shape");
  TORCH_CHECK(query.stride(3) == 1 && key.stride(3) == 1, "head_dim must be contiguous");
  s.q_row = query.stride(2), s.q_head = query.stride(1), s.kv_head = key.stride(1), s.kv_pos = key.stride(2);
  s.scaling = static_cast<float>(scaling);
  auto out = torch::empty({1, s.Q, s.H, s.D}, query.options());
  if (query.scalar_type() == at::kBFloat16) {
    dispatch_kv<at::BFloat16>(query, key, value, out, s);
  } else {
    TORCH_CHECK(query.scalar_type() == at::kFloat, "queries in bf16 or fp32 only");
    dispatch_kv<float>(query, key, value, out, s);
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("causal_attention", &causal_attention, "batch-invariant causal attention for new rows against a KV cache",
        py::call_guard<py::gil_scoped_release>());
}
