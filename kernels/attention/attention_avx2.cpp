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
  m.def("attention_isa", []() { return std::string(tandem_avx2::tile_set_name(tandem_attention::avx512_enabled())); },
        "which partials run: avx512_vnni (16 lanes) or avx2 (8)");
  // Allows, never forces: on a CPU without AVX-512 the 16-lane partials stay off whatever a
  // caller asks (they would stop the process with an illegal instruction). The switch is a
  // static of an inline function, which the draft decoder's module shares with this one.
  m.def("attention_allow_avx512", [](bool on) { tandem_attention::avx512_enabled() = on && tandem_avx2::cpu_has_avx512_vnni(); },
        "allow the 16-lane partials where the CPU has AVX-512 (tests compare both on one machine)");
}
