// Small AVX2 helpers shared by the CPU kernels (kernels/*/..._avx2.cpp, int8_gemm.h). Each is
// one fixed instruction sequence, so a value computed with them does not depend on the caller's
// tile shape: the kernels' batch invariance rests on that.
#pragma once
#include <immintrin.h>
#include <cstdint>
#include <cstring>

namespace tandem_avx2 {

// 8 bf16 values widened to fp32 (a bf16 is the top half of an fp32).
inline __m256 load_bf16x8(const uint16_t* p) {
  __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The sum of 8 lanes, always in the same order.
inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

}  // namespace tandem_avx2
