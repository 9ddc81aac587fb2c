// Causal attention for a few new query rows against a KV cache, computed so that a row's result
// does not depend on how many rows are computed together (batch invariance).
//
// Speculative verification attends k+1 new rows in one call, plain decoding one row per call;
// greedy speculation reproduces plain decoding bit for bit only if both give the same bits.
// PyTorch's SDPA and matmul-based attention do not: their blocking and reduction order change
// with the number of query rows. Here every (row, head) pair is computed alone, in one fixed
// order: scores over exactly the keys the row may see (dot products over head_dim in 8-wide
// vectors, then hsum), a max, exponentials summed key by key, and values accumulated key by key.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "avx2_common.h"

namespace {

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::BFloat16* p) { return tandem_avx2::load_bf16x8(reinterpret_cast<const uint16_t*>(p)); }
using tandem_avx2::hsum;

using tandem_avx2::exp256;

// q [Q, H, D] rows, k/v [KVH, L, D] with strides, out [Q, H, D]; D a multiple of 8.
template <typename T>
void attend(const T* q, int64_t q_row, int64_t q_head, const T* k, const T* v, int64_t kv_head_stride,
            int64_t kv_pos_stride, T* out, int64_t Q, int64_t H, int64_t KVH, int64_t L, int64_t D, float scaling) {
  const int64_t group = H / KVH;
  at::parallel_for(0, Q * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(L + 8);
    std::vector<float> qf(D), acc(D);
    for (int64_t idx = begin; idx < end; ++idx) {
      const int64_t i = idx / H, h = idx % H;
      const int64_t visible = L - Q + i + 1;  // causal: the cached keys and the rows up to i
      const T* qr = q + i * q_row + h * q_head;
      const T* kh = k + (h / group) * kv_head_stride;
      const T* vh = v + (h / group) * kv_head_stride;
      float m = -INFINITY;
      for (int64_t j = 0; j < visible; ++j) {
        const T* kr = kh + j * kv_pos_stride;
        __m256 s = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d += 8) s = _mm256_fmadd_ps(load8(qr + d), load8(kr + d), s);
        const float x = hsum(s) * scaling;
        scores[j] = x;
        m = std::max(m, x);
      }
      // Exponentials 8 at a time (the tail padded with -inf, whose exp is 0), summed lane by lane
      // in key order, then across lanes: a fixed order for a given number of visible keys.
      const int64_t padded = (visible + 7) & ~int64_t(7);
      for (int64_t j = visible; j < padded; ++j) scores[j] = -INFINITY;
      const __m256 mv = _mm256_set1_ps(m);
      __m256 sum8 = _mm256_setzero_ps();
      for (int64_t j = 0; j < padded; j += 8) {
        const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(scores.data() + j), mv));
        _mm256_storeu_ps(scores.data() + j, e);
        sum8 = _mm256_add_ps(sum8, e);
      }
      const __m256 inv = _mm256_set1_ps(1.0f / hsum(sum8));
      // Values key by key (rows of V are contiguous), 8 vectors of head_dim at a time in registers.
      for (int64_t d0 = 0; d0 < D; d0 += 64) {
        const int64_t width = std::min<int64_t>(64, D - d0) / 8;
        __m256 a[8];
        for (int c = 0; c < 8; ++c) a[c] = _mm256_setzero_ps();
        for (int64_t j = 0; j < visible; ++j) {
          const __m256 p = _mm256_set1_ps(scores[j]);
          const T* vr = vh + j * kv_pos_stride + d0;
          for (int c = 0; c < width; ++c) a[c] = _mm256_fmadd_ps(p, load8(vr + 8 * c), a[c]);
        }
        for (int c = 0; c < width; ++c) _mm256_storeu_ps(acc.data() + d0 + 8 * c, _mm256_mul_ps(a[c], inv));
      }
      T* o = out + (i * H + h) * D;
      for (int64_t d = 0; d < D; ++d) o[d] = static_cast<T>(acc[d]);
    }
  });
}

}  // namespace

// query [1, H, Q, D], key/value [1, KVH, L, D] (the cache, new rows last); returns [1, Q, H, D].
torch::Tensor causal_attention(torch::Tensor query, torch::Tensor key, torch::Tensor value, double scaling) {
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4 && query.size(0) == 1, "expects [1, heads, rows, head_dim]");
  TORCH_CHECK(key.strides() == value.strides() && key.sizes() == value.sizes(), "key and value must share a layout");
  TORCH_CHECK(query.scalar_type() == key.scalar_type() && key.scalar_type() == value.scalar_type(), "one dtype for q, k, v");
  const int64_t H = query.size(1), Q = query.size(2), D = query.size(3);
  const int64_t KVH = key.size(1), L = key.size(2);
  TORCH_CHECK(H % KVH == 0 && D % 8 == 0 && key.size(3) == D && L >= Q, "unsupported attention shape");
  TORCH_CHECK(query.stride(3) == 1 && key.stride(3) == 1, "head_dim must be contiguous");
  auto out = torch::empty({1, Q, H, D}, query.options());
  if (query.scalar_type() == at::kBFloat16) {
    attend<at::BFloat16>(query.data_ptr<at::BFloat16>(), query.stride(2), query.stride(1), key.data_ptr<at::BFloat16>(),
                         value.data_ptr<at::BFloat16>(), key.stride(1), key.stride(2), out.data_ptr<at::BFloat16>(), Q, H, KVH, L, D,
                         static_cast<float>(scaling));
  } else {
    TORCH_CHECK(query.scalar_type() == at::kFloat, "bf16 or fp32 only");
    attend<float>(query.data_ptr<float>(), query.stride(2), query.stride(1), key.data_ptr<float>(), value.data_ptr<float>(),
                  key.stride(1), key.stride(2), out.data_ptr<float>(), Q, H, KVH, L, D, static_cast<float>(scaling));
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("causal_attention", &causal_attention, "batch-invariant causal attention for a few new rows",
        py::call_guard<py::gil_scoped_release>());
}
