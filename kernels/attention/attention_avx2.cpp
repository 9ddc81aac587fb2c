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
// Inside a unit, up to six query vectors at a time (heads of the group, rows) share every key
// and value row loaded: scores 2 keys x 6 queries at a time (dot products over head_dim reduced
// by a fixed hadd tree over 4 keys), values 2 vectors x 6 queries; the exponentials 8 at a time.
// A query's arithmetic is the same whichever queries it is grouped with, or none. Keys and
// values may be fp32, bf16 or fp16 (the cache's format), widened once per load for the group.
#include <torch/extension.h>

#include "causal_attention.h"

namespace {

using tandem_attention::Shape;
using tandem_attention::attend;

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

// The rotary embedding of one head's row, t * cos + roll(t, D / 2) * signed_sin, with each
// product and the sum rounded on its own as PyTorch's three elementwise ops round them (the
// runner's _rotate): fp-contract off, or the compiler would fuse a product into the sum (FMA).
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
__attribute__((noinline)) void rotate_row(const float* t, const float* cos, const float* ssin, float* out, int64_t D) {
  const int64_t half = D / 2;
  if (half % 8 == 0) {  // an 8-lane step never straddles the halves
    for (int64_t d = 0; d < D; d += 8) {
      const int64_t from = d < half ? d + half : d - half;
      const __m256 a = _mm256_mul_ps(_mm256_loadu_ps(t + d), _mm256_loadu_ps(cos + d));
      const __m256 b = _mm256_mul_ps(_mm256_loadu_ps(t + from), _mm256_loadu_ps(ssin + d));
      _mm256_storeu_ps(out + d, _mm256_add_ps(a, b));
    }
    return;
  }
  for (int64_t d = 0; d < D; ++d) {
    const float a = t[d] * cos[d], b = t[d < half ? d + half : d - half] * ssin[d];
    out[d] = a + b;
  }
}
#pragma GCC pop_options

// fp32 -> the cache's type, rounded as PyTorch's copy into it rounds (to nearest, ties to even).
template <typename KT>
inline void store_row(const float* x, KT* out, int64_t D) {
  for (int64_t d = 0; d < D; ++d) out[d] = static_cast<KT>(x[d]);
}

template <typename KT>
void rotate_store_attend(const float* qkv, int64_t qkv_row, const float* cos, const float* ssin, float* q, KT* kc, KT* vc,
                         float* out, const Shape& s, int64_t start) {
  const int64_t n = s.Q, H = s.H, KVH = s.KVH, D = s.D;
  std::vector<float> k(D);
  for (int64_t r = 0; r < n; ++r) {
    const float* row = qkv + r * qkv_row;
    const float *c = cos + r * D, *ss = ssin + r * D;
    for (int64_t h = 0; h < H; ++h) rotate_row(row + h * D, c, ss, q + (r * H + h) * D, D);
    for (int64_t h = 0; h < KVH; ++h) {
      rotate_row(row + (H + h) * D, c, ss, k.data(), D);
      store_row(k.data(), kc + h * s.kv_head + (start + r) * s.kv_pos, D);
      store_row(row + (H + KVH + h) * D, vc + h * s.kv_head + (start + r) * s.kv_pos, D);
    }
  }
  attend<float, KT>(q, kc, vc, out, s);
}

}  // namespace

// One attention layer of a decoder after its q / k / v projection, in one call: rotates the
// new rows' queries and keys (rotary embedding, ``cos`` / ``signed_sin`` [n, D] as the runner's
// _rotate takes them), writes their keys and values into the layer's cache rows start .. start +
// n - 1 (k_cache / v_cache [layers, KVH, capacity, D], fp32, bf16 or fp16), and attends them
// over the cache as causal_attention does. qkv [n, (H + 2 KVH) D] fp32: the queries, keys and
// values side by side. Returns [n, H D]. Bit for bit the runner's own sequence (rotate, copy
// into the cache, causal_attention) with a dozen fewer operator calls a layer.
torch::Tensor rotary_attention(torch::Tensor qkv, torch::Tensor cos, torch::Tensor signed_sin, torch::Tensor k_cache,
                               torch::Tensor v_cache, int64_t layer, int64_t start, int64_t heads, int64_t kv_heads,
                               double scaling) {
  TORCH_CHECK(qkv.dim() == 2 && cos.dim() == 2 && signed_sin.dim() == 2 && k_cache.dim() == 4, "unsupported shapes");
  TORCH_CHECK(qkv.scalar_type() == at::kFloat && cos.scalar_type() == at::kFloat && signed_sin.scalar_type() == at::kFloat,
              "qkv, cos and sin in fp32");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes() && k_cache.strides() == v_cache.strides() && k_cache.is_contiguous(),
              "key and value caches must share one contiguous layout");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "one dtype for keys and values");
  Shape s;
  s.Q = qkv.size(0), s.H = heads, s.KVH = kv_heads, s.D = k_cache.size(3);
  TORCH_CHECK(s.Q > 0 && s.H > 0 && s.KVH > 0 && s.H % s.KVH == 0 && s.D % 8 == 0 && k_cache.size(1) == s.KVH,
              "unsupported attention shape");
  TORCH_CHECK(qkv.size(1) == (s.H + 2 * s.KVH) * s.D && qkv.stride(1) == 1, "qkv must be [rows, (H + 2 KVH) D], rows contiguous");
  TORCH_CHECK(cos.is_contiguous() && signed_sin.is_contiguous() && cos.size(0) == s.Q && cos.size(1) == s.D &&
              signed_sin.sizes() == cos.sizes(), "cos / sin must be [rows, D] contiguous");
  TORCH_CHECK(layer >= 0 && layer < k_cache.size(0) && start >= 0 && start + s.Q <= k_cache.size(2), "cache rows out of range");
  s.L = start + s.Q;
  s.q_row = s.H * s.D, s.q_head = s.D, s.kv_head = k_cache.stride(1), s.kv_pos = k_cache.stride(2);
  s.scaling = static_cast<float>(scaling);
  auto q = torch::empty({s.Q, s.H, s.D}, qkv.options());
  auto out = torch::empty({s.Q, s.H * s.D}, qkv.options());
  const int64_t offset = layer * k_cache.stride(0);
  const float *x = qkv.data_ptr<float>(), *c = cos.data_ptr<float>(), *ss = signed_sin.data_ptr<float>();
  switch (k_cache.scalar_type()) {
    case at::kFloat:
      rotate_store_attend<float>(x, qkv.stride(0), c, ss, q.data_ptr<float>(), k_cache.data_ptr<float>() + offset,
                                 v_cache.data_ptr<float>() + offset, out.data_ptr<float>(), s, start);
      break;
    case at::kBFloat16:
      rotate_store_attend<at::BFloat16>(x, qkv.stride(0), c, ss, q.data_ptr<float>(), k_cache.data_ptr<at::BFloat16>() + offset,
                                        v_cache.data_ptr<at::BFloat16>() + offset, out.data_ptr<float>(), s, start);
      break;
    case at::kHalf:
      rotate_store_attend<at::Half>(x, qkv.stride(0), c, ss, q.data_ptr<float>(), k_cache.data_ptr<at::Half>() + offset,
                                    v_cache.data_ptr<at::Half>() + offset, out.data_ptr<float>(), s, start);
      break;
    default: TORCH_CHECK(false, "keys and values in fp32, bf16 or fp16 only");
  }
  return out;
}

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
  m.def("rotary_attention", &rotary_attention,
        "rotate the new rows' queries and keys, write keys and values into a layer's cache, attend",
        py::call_guard<py::gil_scoped_release>());
  m.def("attention_isa", []() { return std::string(tandem_avx2::tile_set_name(tandem_attention::avx512_enabled())); },
        "which partials run: avx512_vnni (16 lanes) or avx2 (8)");
  // Allows, never forces: on a CPU without AVX-512 the 16-lane partials stay off whatever a
  // caller asks (they would stop the process with an illegal instruction). The switch is a
  // static of an inline function, which the draft decoder's module shares with this one.
  m.def("attention_allow_avx512", [](bool on) { tandem_attention::avx512_enabled() = on && tandem_avx2::cpu_has_avx512_vnni(); },
        "allow the 16-lane partials where the CPU has AVX-512 (tests compare both on one machine)");
}
