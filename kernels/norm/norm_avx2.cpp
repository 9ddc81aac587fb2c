// The residual add after a decoder block and the RMSNorm of the next, in one call.
//
// Why: on a one-row decode step these are ~7 tiny PyTorch operator calls each (add, pow, mean,
// add, rsqrt, two products), twice a layer, and the calls cost more than their arithmetic.
// The result must keep the bits of transformers' RMSNorm (reference.py), which the GGUF runner's
// tests compare bit for bit: the mean of squares is PyTorch's own (at::mean, whose reduction
// order is its own), every other step the same IEEE operation in the same order, each rounded
// on its own (compiled with fp-contract off).
#include <torch/extension.h>

#include <immintrin.h>

#include <cmath>
#include <vector>

namespace {

// s = x + delta, and sq = s * s, 8 lanes at a time.
void add_and_square(const float* x, const float* delta, float* s, float* sq, int64_t count) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256 v = _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(delta + i));
    _mm256_storeu_ps(s + i, v);
    _mm256_storeu_ps(sq + i, _mm256_mul_ps(v, v));
  }
  for (; i < count; ++i) {
    s[i] = x[i] + delta[i];
    sq[i] = s[i] * s[i];
  }
}

// out = weight * (s * r) for one row, r = 1 / sqrt(mean + eps).
void scale_row(const float* s, const float* weight, float r, float* out, int64_t H) {
  const __m256 rv = _mm256_set1_ps(r);
  int64_t i = 0;
  for (; i + 8 <= H; i += 8)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(weight + i), _mm256_mul_ps(_mm256_loadu_ps(s + i), rv)));
  for (; i < H; ++i) out[i] = weight[i] * (s[i] * r);
}

}  // namespace

// x, delta [n, H] fp32 contiguous; weight [H] fp32. Returns (x + delta, the RMSNorm of it).
std::vector<torch::Tensor> add_rms_norm(torch::Tensor x, torch::Tensor delta, torch::Tensor weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.sizes() == delta.sizes() && weight.dim() == 1 && weight.size(0) == x.size(1),
              "expects x and delta [rows, H] and weight [H]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && delta.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat,
              "fp32 only");
  TORCH_CHECK(x.is_contiguous() && delta.is_contiguous() && weight.is_contiguous(), "contiguous rows only");
  const int64_t n = x.size(0), H = x.size(1);
  auto s = torch::empty_like(x), sq = torch::empty_like(x), out = torch::empty_like(x);
  add_and_square(x.data_ptr<float>(), delta.data_ptr<float>(), s.data_ptr<float>(), sq.data_ptr<float>(), n * H);
  // PyTorch's mean (its sum, divided by H), so the reduction order is the one transformers gets.
  const auto mean = at::mean(sq, {-1}, /*keepdim=*/false);
  const float* m = mean.data_ptr<float>();
  // var + eps as PyTorch adds a Python float to an fp32 tensor (the scalar taken as fp32), then
  // rsqrt as 1 / sqrt, both correctly rounded (PyTorch's scalar and vector paths alike).
  const float feps = static_cast<float>(eps);
  for (int64_t r = 0; r < n; ++r) {
    const float inv = 1.0f / std::sqrt(m[r] + feps);
    scale_row(s.data_ptr<float>() + r * H, weight.data_ptr<float>(), inv, out.data_ptr<float>() + r * H, H);
  }
  return {s, out};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("add_rms_norm", &add_rms_norm, "x + delta and its RMSNorm, with transformers' RMSNorm's bits",
        py::call_guard<py::gil_scoped_release>());
}
