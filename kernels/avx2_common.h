// Small AVX2 helpers shared by the CPU kernels (kernels/*/..._avx2.cpp, the tile headers). Each is
// one fixed instruction sequence, so a value computed with them does not depend on the caller's
// tile shape: the kernels' batch invariance rests on that.
#pragma once
#include <immintrin.h>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace tandem_avx2 {

// Whether this CPU runs the AVX-512 VNNI tiles (int16_inputs_vnni.h, int4_gemm_vnni.h).
inline bool cpu_has_avx512_vnni() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vnni");
  return has;
}

// The environment may turn the AVX-512 tiles off (TANDEM_AVX512=0), to measure the AVX2 ones on
// the same machine.
inline bool avx512_allowed_by_env() {
  const char* env = std::getenv("TANDEM_AVX512");
  return env == nullptr || std::string(env) != "0";
}

// The name of the tile set a kernel family runs, given whether its VNNI tiles are allowed:
// "avx512_vnni" where the CPU has them too, else "avx2" (reports, tests).
inline const char* tile_set_name(bool vnni_allowed) { return vnni_allowed && cpu_has_avx512_vnni() ? "avx512_vnni" : "avx2"; }

// 8 bf16 values widened to fp32 (a bf16 is the top half of an fp32).
inline __m256 load_bf16x8(const uint16_t* p) {
  __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

// 8 int8 values widened to fp32.
inline __m256 load_i8x8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
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

// The largest of 8 lanes (exact, so in any order).
inline float hmax(__m256 v) {
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}

// exp for softmaxes (Cephes-style range reduction + degree-5 polynomial, ~1 ulp).
inline __m256 exp256(__m256 x) {
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f));
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

}  // namespace tandem_avx2
