// The input side of the GGUF linear (reference.py's quantize_input), bit for bit: each row of x
// per block of QB values (256 for K-quants, 32 for the legacy types) to int8 with one fp32
// scale, plus the exact integer sums of xq per 16 and per 32 values that the weights' offsets,
// mins and Q6_K's -32 multiply.
#pragma once
#include <immintrin.h>
#include <cstdint>
#include <vector>

namespace tandem_gguf {

// gguf.GGMLQuantizationType values.
enum Type : int64_t { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

// The largest of 8 lanes (exact, so in any order).
inline float lane_max(__m256 v) {
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}

struct Inputs {
  std::vector<int8_t> q;      // [M][K]
  std::vector<float> dx;      // [M][K / QB]
  std::vector<int16_t> xs16;  // [M][K / 16]
  std::vector<int16_t> xs32;  // [M][K / 32]
  int64_t K = 0, QB = 0, blocks = 0;  // blocks = K / QB, kept: a division per block cost more than the block

  const int8_t* row(int64_t m) const { return q.data() + m * K; }
  float scale(int64_t m, int64_t b) const { return dx[m * blocks + b]; }
  const int16_t* sums16(int64_t m) const { return xs16.data() + m * (K / 16); }
  const int16_t* sums32(int64_t m) const { return xs32.data() + m * (K / 32); }
};

// 32 fp32 values times s, rounded half to even (the MXCSR default), to 32 int8 in order.
inline __m256i round_to_int8(const float* x, __m256 s) {
  __m256i qi[4];
  for (int i = 0; i < 4; ++i) qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), s));
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
  return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));  // packs work per 128-bit lane
}

// 16 int8 -> their sum (exact).
inline int16_t sum16(const int8_t* q) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  const __m128i w = _mm_madd_epi16(_mm_cvtepi8_epi16(v), _mm_set1_epi16(1));
  const __m128i h = _mm_madd_epi16(_mm_cvtepi8_epi16(_mm_srli_si128(v, 8)), _mm_set1_epi16(1));
  __m128i s = _mm_add_epi32(w, h);
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return static_cast<int16_t>(_mm_cvtsi128_si32(s));
}

// amax = max |x|; iscale = 127 / amax; xq = round(x * iscale); dx = amax / 127 (0 where amax = 0).
// ``interleave``: xq's 32-value chunks stored in the order A C B D per 128 (the sums stay in the
// values' order), as the VNNI Q4_K / Q5_K tiles read their nibbles: one 64-byte load of codes
// holds sub-blocks A and C in its low nibbles, B and D in its high ones.
inline void quantize_inputs(const float* X, int64_t M, int64_t K, int64_t QB, Inputs& in, bool interleave = false) {
  in.K = K;
  in.QB = QB;
  in.blocks = K / QB;
  in.q.resize(M * K);
  in.dx.resize(M * (K / QB));
  in.xs16.resize(M * (K / 16));
  in.xs32.resize(M * (K / 32));
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < K / QB; ++b) {
      const float* x = X + m * K + b * QB;
      int8_t* q = in.q.data() + m * K + b * QB;
      __m256 amax = _mm256_setzero_ps();
      for (int64_t i = 0; i < QB; i += 8) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
      const float a = lane_max(amax);
      float dx = 0.0f;
      if (a > 0.0f) {
        const __m256 iscale = _mm256_set1_ps(127.0f / a);
        dx = a / 127.0f;
        for (int64_t i = 0; i < QB; i += 32)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), round_to_int8(x + i, iscale));
      } else {
        for (int64_t i = 0; i < QB; ++i) q[i] = 0;
      }
      in.dx[m * (K / QB) + b] = dx;
    }
    const int8_t* q = in.q.data() + m * K;
    for (int64_t j = 0; j < K / 16; ++j) in.xs16[m * (K / 16) + j] = sum16(q + 16 * j);
    for (int64_t j = 0; j < K / 32; ++j)
      in.xs32[m * (K / 32) + j] = static_cast<int16_t>(in.xs16[m * (K / 16) + 2 * j] + in.xs16[m * (K / 16) + 2 * j + 1]);
    if (interleave)
      for (int64_t c = 0; c + 128 <= K; c += 128) {
        int8_t* chunk = in.q.data() + m * K + c;
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 32));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(chunk + 32), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 64)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(chunk + 64), b);
      }
  }
}

}  // namespace tandem_gguf
