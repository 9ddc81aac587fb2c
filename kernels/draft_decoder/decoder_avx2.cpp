// One pre-norm decoder layer (Llama / Qwen2 shape: RMSNorm, rotary GQA attention, SwiGLU MLP)
// with int8 or int4 weights, for M new tokens at positions pos0 .. pos0+M-1, in one call. A drafter
// step is ~25 of these; run as PyTorch modules each costs ~50 small ops, whose dispatch
// overhead is a sizeable part of a draft step once the weights are int8. The contract is
// kernels/draft_decoder/reference.py.
#include "int8_gemm.h"
#include "int16_inputs.h"
#include "int4_gemm.h"
#include "causal_attention.h"

#include <cmath>
#include <initializer_list>
#include <vector>

namespace {

using tandem_avx2::exp256;

void rms_norm(const float* x, const float* w, float* out, int64_t M, int64_t H, float eps) {
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * H;
    double ss = 0.0;
    for (int64_t i = 0; i < H; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float r = 1.0f / std::sqrt(static_cast<float>(ss / H) + eps);
    for (int64_t i = 0; i < H; ++i) out[m * H + i] = w[i] * (xr[i] * r);
  }
}

// HF's rotate_half convention: pairs (i, i + D/2) rotate by the angle of frequency i.
void rope(float* t, int64_t M, int64_t heads, int64_t D, const float* cos, const float* sin) {
  const int64_t half = D / 2;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t h = 0; h < heads; ++h) {
      float* v = t + (m * heads + h) * D;
      for (int64_t i = 0; i < half; ++i) {
        const float c = cos[m * half + i], s = sin[m * half + i];
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
      }
    }
}

// out[m, h, :] = softmax_t(q[m, h] . K[g, t] / sqrt(D)) @ V[g, t], t <= pos0 + m, g = h / group:
// the attention kernel's own arithmetic (kernels/attention/causal_attention.h), which reads each
// KV head's keys and values once for all its query heads and rows, over a cache of fp32 or fp16.
template <typename KT>
void attention(const float* q, const KT* kc, const KT* vc, float* out, int64_t M, int64_t nh, int64_t nkv, int64_t D,
               int64_t cap, int64_t pos0) {
  tandem_attention::Shape s;
  s.Q = M, s.H = nh, s.KVH = nkv, s.L = pos0 + M, s.D = D;
  s.q_row = nh * D, s.q_head = D, s.kv_head = cap * D, s.kv_pos = D;
  s.scaling = 1.0f / std::sqrt(static_cast<float>(D));
  tandem_attention::attend<float, KT>(q, kc, vc, out, s);
}

// Writes the M new rows' keys or values [M, n_kv, D] into the cache [n_kv, cap, D] at pos0.
template <typename KT>
void store_rows(const float* rows, KT* cache, int64_t M, int64_t nkv, int64_t D, int64_t cap, int64_t pos0) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < nkv; ++g) {
      const float* from = rows + (m * nkv + g) * D;
      KT* to = cache + (g * cap + pos0 + m) * D;
      for (int64_t i = 0; i < D; ++i) to[i] = static_cast<KT>(from[i]);
    }
}

// g <- silu(g) * u = g / (1 + exp(-g)) * u
void silu_mul(float* g, const float* u, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv));
    _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

const float* opt_ptr(const c10::optional<torch::Tensor>& t) {
  return t.has_value() && t->defined() ? t->data_ptr<float>() : nullptr;
}

// A linear layer's weights: int8 (q, scale) in either int8 layout, or int4 (packed panels, scale
// panels) with its offsets in ``off``.
struct Weight {
  const torch::Tensor& w;
  const torch::Tensor& s;
  const torch::Tensor* off;  // int4 offsets, or nullptr
  bool int16_inputs;         // int8 targets: inputs rounded to int16 (quant_linear's linear_a16)
  bool int4() const { return w.scalar_type() == at::kByte; }
  int64_t out_features() const { return int4() ? w.size(0) * 4 : s.numel(); }
};

void check(const Weight& w, int64_t K) {
  if (w.int4()) {
    TORCH_CHECK(w.off != nullptr && w.off->defined(), "an int4 layer needs its offsets");
    tandem_int4::check_weight(w.w, w.s, *w.off, K);
  } else {
    tandem_int8::check_weight(w.w, w.s, K);
    TORCH_CHECK(!w.int16_inputs || w.w.dim() == 2, "int16 inputs need the row layout [N, K]");
  }
}

// out[M, N] = h[M, K] . W^T + b.
void lin(const float* h, int64_t M, int64_t K, const Weight& w, const c10::optional<torch::Tensor>& b, float* out) {
  if (w.int4())
    tandem_int4::linear_into(h, M, K, w.w.data_ptr<uint8_t>(), tandem_int4::half_ptr(w.s), tandem_int4::half_ptr(*w.off),
                             opt_ptr(b), w.out_features(), out);
  else if (w.int16_inputs)
    tandem_a16::linear_into(h, M, K, w.w.data_ptr<int8_t>(), w.s.data_ptr<float>(), opt_ptr(b), w.out_features(), out);
  else
    tandem_int8::linear_into_any(h, M, K, w.w, w.s.data_ptr<float>(), opt_ptr(b), w.out_features(), out);
}

// outs[i][M, N_i] = h[M, K] . W_i^T + b_i for weights on one input. All int4: the input is
// quantized once and the weights share one parallel region (tandem_int4::linear_group_into);
// else one call each. Same bits either way.
void lin_group(const float* h, int64_t M, int64_t K, std::initializer_list<const Weight*> ws,
               std::initializer_list<const c10::optional<torch::Tensor>*> bs, std::initializer_list<float*> outs) {
  const auto w = ws.begin();
  const auto b = bs.begin();
  const auto o = outs.begin();
  const int count = static_cast<int>(ws.size());
  bool all_int4 = true;
  for (int i = 0; i < count; ++i) all_int4 = all_int4 && w[i]->int4();
  if (!all_int4) {
    for (int i = 0; i < count; ++i) lin(h, M, K, *w[i], *b[i], o[i]);
    return;
  }
  tandem_int4::Quantized xq;
  tandem_int4::quantize_rows(h, M, K, xq);
  std::vector<tandem_int4::Args> args;
  for (int i = 0; i < count; ++i)
    args.push_back({xq.q.data(), xq.d.data(), xq.sum.data(), w[i]->w.data_ptr<uint8_t>(), tandem_int4::half_ptr(w[i]->s),
                    tandem_int4::half_ptr(*w[i]->off), opt_ptr(*b[i]), o[i], K, w[i]->out_features()});
  tandem_int4::linear_group_into(args.data(), count, M);
}

}  // namespace

// Runs the layer on x [M, H] fp32 in place and writes the new keys/values into kc/vc
// [n_kv, cap, D] (fp32 or fp16) at positions pos0 .. pos0+M-1. cos/sin: [M, D/2] for those positions.
void decoder_layer(torch::Tensor x, torch::Tensor ln1,
                   torch::Tensor wq, torch::Tensor sq, c10::optional<torch::Tensor> bq,
                   torch::Tensor wk, torch::Tensor sk, c10::optional<torch::Tensor> bk,
                   torch::Tensor wv, torch::Tensor sv, c10::optional<torch::Tensor> bv,
                   torch::Tensor wo, torch::Tensor so, c10::optional<torch::Tensor> bo,
                   torch::Tensor ln2,
                   torch::Tensor wg, torch::Tensor sg, torch::Tensor wu, torch::Tensor su,
                   torch::Tensor wd, torch::Tensor sd,
                   torch::Tensor kc, torch::Tensor vc, torch::Tensor cos, torch::Tensor sin,
                   int64_t pos0, int64_t n_heads, int64_t n_kv, double eps, std::vector<torch::Tensor> offsets,
                   bool int16_inputs) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), "x must be [M, H] fp32");
  TORCH_CHECK(offsets.empty() || offsets.size() == 7, "offsets: none, or one per linear layer (q, k, v, o, gate, up, down)");
  auto off = [&](int i) -> const torch::Tensor* { return offsets.empty() ? nullptr : &offsets[i]; };
  const bool a16 = int16_inputs;
  const Weight Wq{wq, sq, off(0), a16}, Wk{wk, sk, off(1), a16}, Wv{wv, sv, off(2), a16}, Wo{wo, so, off(3), a16};
  const Weight Wg{wg, sg, off(4), a16}, Wu{wu, su, off(5), a16}, Wd{wd, sd, off(6), a16};
  const int64_t M = x.size(0), H = x.size(1);
  const int64_t D = Wq.out_features() / n_heads, I = Wg.out_features(), cap = kc.size(1);
  check(Wq, H); check(Wk, H); check(Wv, H); check(Wo, n_heads * D);
  check(Wg, H); check(Wu, H); check(Wd, I);
  TORCH_CHECK(Wk.out_features() == n_kv * D && Wv.out_features() == n_kv * D && n_heads % n_kv == 0, "head shapes do not match");
  TORCH_CHECK((kc.scalar_type() == at::kFloat || kc.scalar_type() == at::kHalf) && vc.scalar_type() == kc.scalar_type() &&
              kc.is_contiguous() && vc.is_contiguous() && kc.size(0) == n_kv && kc.size(2) == D && D % 8 == 0,
              "cache must be [n_kv, cap, D] fp32 or fp16, head_dim a multiple of 8");
  TORCH_CHECK(pos0 + M <= cap, "cache too small");
  TORCH_CHECK(cos.size(0) == M && cos.size(1) == D / 2 && cos.is_contiguous() && sin.is_contiguous(), "cos/sin must be [M, D/2]");
  for (const auto* t : {&ln1, &ln2}) TORCH_CHECK(t->scalar_type() == at::kFloat && t->numel() == H, "norm weights must be [H] fp32");
  for (const auto* b : {&bq, &bk, &bv, &bo})
    TORCH_CHECK(!b->has_value() || !(*b)->defined() || ((*b)->scalar_type() == at::kFloat && (*b)->is_contiguous()), "biases must be fp32");

  float* X = x.data_ptr<float>();
  const float fe = static_cast<float>(eps);
  std::vector<float> h(M * H), q(M * n_heads * D), k(M * n_kv * D), v(M * n_kv * D), a(M * n_heads * D), o(M * H);
  rms_norm(X, ln1.data_ptr<float>(), h.data(), M, H, fe);
  lin_group(h.data(), M, H, {&Wq, &Wk, &Wv}, {&bq, &bk, &bv}, {q.data(), k.data(), v.data()});
  rope(q.data(), M, n_heads, D, cos.data_ptr<float>(), sin.data_ptr<float>());
  rope(k.data(), M, n_kv, D, cos.data_ptr<float>(), sin.data_ptr<float>());
  if (kc.scalar_type() == at::kHalf) {
    at::Half* KC = kc.data_ptr<at::Half>();
    at::Half* VC = vc.data_ptr<at::Half>();
    store_rows(k.data(), KC, M, n_kv, D, cap, pos0);
    store_rows(v.data(), VC, M, n_kv, D, cap, pos0);
    attention(q.data(), KC, VC, a.data(), M, n_heads, n_kv, D, cap, pos0);
  } else {
    float* KC = kc.data_ptr<float>();
    float* VC = vc.data_ptr<float>();
    store_rows(k.data(), KC, M, n_kv, D, cap, pos0);
    store_rows(v.data(), VC, M, n_kv, D, cap, pos0);
    attention(q.data(), KC, VC, a.data(), M, n_heads, n_kv, D, cap, pos0);
  }
  lin(a.data(), M, n_heads * D, Wo, bo, o.data());
  for (int64_t i = 0; i < M * H; ++i) X[i] += o[i];

  rms_norm(X, ln2.data_ptr<float>(), h.data(), M, H, fe);
  std::vector<float> gate(M * I), up(M * I);
  const c10::optional<torch::Tensor> none;
  lin_group(h.data(), M, H, {&Wg, &Wu}, {&none, &none}, {gate.data(), up.data()});
  silu_mul(gate.data(), up.data(), M * I);
  lin(gate.data(), M, I, Wd, none, o.data());
  for (int64_t i = 0; i < M * H; ++i) X[i] += o[i];
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // Release the GIL while computing: the Qt window's thread must keep running during a step.
  m.def("decoder_layer", &decoder_layer, "int8 / int4 pre-norm decoder layer (RMSNorm, rotary GQA attention, SwiGLU)",
        py::call_guard<py::gil_scoped_release>());
  m.def("a16_isa", &tandem_a16::tile_set,
        "which tiles int8 targets' layers (int16 inputs) run, for widths that are a multiple of 32");
  m.def("int4_isa", &tandem_int4::tile_set, "which tiles int4 layers run: avx512_vnni or avx2");
  m.def("int4_allow_vnni", [](bool on) { tandem_int4::vnni_enabled() = on; },
        "allow the AVX-512 VNNI tiles for int4 layers where the CPU has them (tests)");
}
