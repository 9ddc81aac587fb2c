// A measured prototype, not product code: Q4_K blocks times int8 inputs on AVX2 with eight
// weight rows interleaved once at load (as llama.cpp's repacked layout), to weigh that layout
// against the GGUF file's row layout that kernels/gguf_linear/gguf_tiles.h computes from.
//
//   g++ -O3 -mavx2 -mfma -mf16c scripts/q4k_interleaved_bench.cpp -o /tmp/q4k && /tmp/q4k 8960 1536 100
//   (the row layout at the same shape: time kernels.gguf_linear.linear on one thread, as
//   scripts/gguf_linear_bench.py does, with torch.set_num_threads(1))
//
// Why it is faster: one register holds four rows' codes of one 32-value sub-block against the
// same eight inputs broadcast, so four vpmaddubsw results add in 16 bits before one vpmaddwd
// applies the four rows' scales (1.25 multiplies per 32 values of a row against the row
// layout's 2), the codes of eight rows are unpacked once for every input row, the scales and
// mins sit decoded and transposed (no gather, no shuffles per row), and no horizontal sums but
// one per block. Checks: every block's integer sum equals the scalar one; the multi-row path's
// row 0 is bit-identical to the one-row path's (the same fp32 steps, in block order).
#include <immintrin.h>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

constexpr int QK = 256;

// Row layout, decoded: per row, per block: 256 codes (0..15), 8 scales (0..63), 8 mins (0..63), d, dmin (floats here).
struct RowBlocks { std::vector<uint8_t> codes, scales, mins; std::vector<float> d, dmin; int n, nb; };

// Interleaved: per group of 8 rows, per block:
//   codes[8 sub][4 chunks][32 bytes]: byte p = row (p/8) low nibble | row 4 + p/8 high nibble, value 32j+8c+p%8
//   scales[8 sub][8 rows] uint8; mins[4 k][8 rows][2] uint8 (row's mins 2k, 2k+1); d[8], dmin[8] fp16
struct Packed { std::vector<uint8_t> bytes; int groups, nb; static constexpr int kBlock = 1024 + 64 + 64 + 16 + 16; };

Packed pack(const RowBlocks& w) {
  Packed p; p.groups = w.n / 8; p.nb = w.nb; p.bytes.assign((size_t)p.groups * p.nb * Packed::kBlock, 0);
  for (int g = 0; g < p.groups; ++g)
    for (int b = 0; b < w.nb; ++b) {
      uint8_t* o = &p.bytes[((size_t)g * p.nb + b) * Packed::kBlock];
      for (int j = 0; j < 8; ++j)
        for (int c = 0; c < 4; ++c)
          for (int q = 0; q < 32; ++q) {
            int r = q / 8, v = 32 * j + 8 * c + q % 8;
            uint8_t lo = w.codes[((size_t)(8 * g + r) * w.nb + b) * QK + v];
            uint8_t hi = w.codes[((size_t)(8 * g + 4 + r) * w.nb + b) * QK + v];
            o[(j * 4 + c) * 32 + q] = lo | (hi << 4);
          }
      for (int j = 0; j < 8; ++j)
        for (int r = 0; r < 8; ++r) o[1024 + j * 8 + r] = w.scales[((size_t)(8 * g + r) * w.nb + b) * 8 + j];
      for (int k = 0; k < 4; ++k)
        for (int r = 0; r < 8; ++r)
          for (int e = 0; e < 2; ++e) o[1088 + k * 16 + r * 2 + e] = w.mins[((size_t)(8 * g + r) * w.nb + b) * 8 + 2 * k + e];
      for (int r = 0; r < 8; ++r) {
        uint16_t hd = _cvtss_sh(w.d[(size_t)(8 * g + r) * w.nb + b], 0), hm = _cvtss_sh(w.dmin[(size_t)(8 * g + r) * w.nb + b], 0);
        memcpy(o + 1152 + 2 * r, &hd, 2); memcpy(o + 1168 + 2 * r, &hm, 2);
      }
    }
  return p;
}

// out[8 rows of group g] = sum_b d*dx*S + (-dmin)*dx*Mn, block order.
inline void group_dot(const uint8_t* blk0, int nb, const int8_t* x, const float* dx, const int16_t* xs, float* out, int32_t* S_out) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  // vpshufb masks: lane l (64-bit) of quad Q gets scale byte 4Q+l as int16 (byte, 0) four times.
  const __m256i mq0 = _mm256_setr_epi8(0, -1, 0, -1, 0, -1, 0, -1, 1, -1, 1, -1, 1, -1, 1, -1,
                                       2, -1, 2, -1, 2, -1, 2, -1, 3, -1, 3, -1, 3, -1, 3, -1);
  const __m256i mq1 = _mm256_add_epi8(mq0, _mm256_setr_epi8(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0,
                                                            4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0));
  const __m256i mq1f = _mm256_or_si256(mq1, _mm256_setr_epi8(0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128,
                                                             0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128));
  __m256 acc = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const uint8_t* o = blk0 + (size_t)b * Packed::kBlock;
    const int8_t* xb = x + b * QK;
    __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      __m256i p0, p1;
      for (int c = 0; c < 4; ++c) {
        const __m256i bytes = _mm256_loadu_si256((const __m256i*)(o + (j * 4 + c) * 32));
        const __m256i xv = _mm256_set1_epi64x(*(const int64_t*)(xb + 32 * j + 8 * c));
        const __m256i w0 = _mm256_and_si256(bytes, m4), w1 = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), m4);
        const __m256i q0 = _mm256_maddubs_epi16(w0, xv), q1 = _mm256_maddubs_epi16(w1, xv);
        if (c == 0) { p0 = q0; p1 = q1; } else { p0 = _mm256_add_epi16(p0, q0); p1 = _mm256_add_epi16(p1, q1); }
      }
      const __m256i sb = _mm256_set1_epi64x(*(const int64_t*)(o + 1024 + j * 8));
      a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(p0, _mm256_shuffle_epi8(sb, mq0)));
      a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(p1, _mm256_shuffle_epi8(sb, mq1f)));
    }
    // a0 = [r0 r0 r1 r1 | r2 r2 r3 r3], a1 likewise rows 4..7 -> S = [r0..r7]
    const __m256i h = _mm256_hadd_epi32(a0, a1);  // [r0 r1 r4 r5 | r2 r3 r6 r7]
    const __m256i S = _mm256_permute4x64_epi64(h, 0xD8);
    if (S_out) _mm256_storeu_si256((__m256i*)(S_out + 8 * b), S);
    // Mn for 8 rows: 4 vpmaddwd of (mins 2k, 2k+1) against (xs 2k, 2k+1).
    int32_t pairs[4]; memcpy(pairs, xs + 8 * b, 16);
    __m256i mn = _mm256_setzero_si256();
    for (int k = 0; k < 4; ++k) {
      const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(o + 1088 + 16 * k)));
      mn = _mm256_add_epi32(mn, _mm256_madd_epi16(w, _mm256_set1_epi32(pairs[k])));
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(o + 1152)));
    const __m256 dm = _mm256_xor_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(o + 1168))), _mm256_set1_ps(-0.0f));
    const __m256 dxv = _mm256_set1_ps(dx[b]);
    __m256 t = _mm256_mul_ps(_mm256_mul_ps(d, dxv), _mm256_cvtepi32_ps(S));
    t = _mm256_add_ps(t, _mm256_mul_ps(_mm256_mul_ps(dm, dxv), _mm256_cvtepi32_ps(mn)));
    acc = _mm256_add_ps(acc, t);
  }
  _mm256_storeu_ps(out, acc);
}


// MR input rows: the codes unpacked once per chunk, each row's products beside.
template <int MR>
inline void group_dot_rows(const uint8_t* blk0, int nb, const int8_t* const* x, const float* const* dx, const int16_t* const* xs, float* const* out) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i mq0 = _mm256_setr_epi8(0, -1, 0, -1, 0, -1, 0, -1, 1, -1, 1, -1, 1, -1, 1, -1,
                                       2, -1, 2, -1, 2, -1, 2, -1, 3, -1, 3, -1, 3, -1, 3, -1);
  const __m256i mq1 = _mm256_setr_epi8(4, -1, 4, -1, 4, -1, 4, -1, 5, -1, 5, -1, 5, -1, 5, -1,
                                       6, -1, 6, -1, 6, -1, 6, -1, 7, -1, 7, -1, 7, -1, 7, -1);
  __m256 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const uint8_t* o = blk0 + (size_t)b * Packed::kBlock;
    __m256i a0[MR], a1[MR];
    for (int r = 0; r < MR; ++r) a0[r] = a1[r] = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      __m256i p0[MR], p1[MR];
      for (int c = 0; c < 4; ++c) {
        const __m256i bytes = _mm256_loadu_si256((const __m256i*)(o + (j * 4 + c) * 32));
        const __m256i w0 = _mm256_and_si256(bytes, m4), w1 = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), m4);
        for (int r = 0; r < MR; ++r) {
          const __m256i xv = _mm256_set1_epi64x(*(const int64_t*)(x[r] + b * QK + 32 * j + 8 * c));
          const __m256i q0 = _mm256_maddubs_epi16(w0, xv), q1 = _mm256_maddubs_epi16(w1, xv);
          if (c == 0) { p0[r] = q0; p1[r] = q1; } else { p0[r] = _mm256_add_epi16(p0[r], q0); p1[r] = _mm256_add_epi16(p1[r], q1); }
        }
      }
      const __m256i sb = _mm256_set1_epi64x(*(const int64_t*)(o + 1024 + j * 8));
      const __m256i s0 = _mm256_shuffle_epi8(sb, mq0), s1 = _mm256_shuffle_epi8(sb, mq1);
      for (int r = 0; r < MR; ++r) {
        a0[r] = _mm256_add_epi32(a0[r], _mm256_madd_epi16(p0[r], s0));
        a1[r] = _mm256_add_epi32(a1[r], _mm256_madd_epi16(p1[r], s1));
      }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(o + 1152)));
    const __m256 dm = _mm256_xor_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(o + 1168))), _mm256_set1_ps(-0.0f));
    __m256i wm[4];
    for (int k = 0; k < 4; ++k) wm[k] = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(o + 1088 + 16 * k)));
    for (int r = 0; r < MR; ++r) {
      const __m256i S = _mm256_permute4x64_epi64(_mm256_hadd_epi32(a0[r], a1[r]), 0xD8);
      int32_t pairs[4]; memcpy(pairs, xs[r] + 8 * b, 16);
      __m256i mn = _mm256_madd_epi16(wm[0], _mm256_set1_epi32(pairs[0]));
      for (int k = 1; k < 4; ++k) mn = _mm256_add_epi32(mn, _mm256_madd_epi16(wm[k], _mm256_set1_epi32(pairs[k])));
      const __m256 dxv = _mm256_set1_ps(dx[r][b]);
      __m256 t = _mm256_mul_ps(_mm256_mul_ps(d, dxv), _mm256_cvtepi32_ps(S));
      t = _mm256_add_ps(t, _mm256_mul_ps(_mm256_mul_ps(dm, dxv), _mm256_cvtepi32_ps(mn)));
      acc[r] = _mm256_add_ps(acc[r], t);
    }
  }
  for (int r = 0; r < MR; ++r) _mm256_storeu_ps(out[r], acc[r]);
}

template <int MR>
double time_rows(const Packed& p, const int8_t* x, const float* dx, const int16_t* xs, std::vector<float>& outbuf, int reps) {
  const int8_t* xr[MR]; const float* dr[MR]; const int16_t* sr[MR]; float* orow[MR];
  for (int r = 0; r < MR; ++r) { xr[r] = x; dr[r] = dx; sr[r] = xs; }
  auto t0 = std::chrono::steady_clock::now();
  for (int rep = 0; rep < reps; ++rep)
    for (int g = 0; g < p.groups; ++g) {
      for (int r = 0; r < MR; ++r) orow[r] = &outbuf[(size_t)r * p.groups * 8 + 8 * g];
      group_dot_rows<MR>(&p.bytes[(size_t)g * p.nb * Packed::kBlock], p.nb, xr, dr, sr, orow);
    }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps * 1e3;
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 256, k = argc > 2 ? atoi(argv[2]) : 1536, reps = argc > 3 ? atoi(argv[3]) : 2000;
  RowBlocks w; w.n = n; w.nb = k / QK;
  std::mt19937 rng(1);
  w.codes.resize((size_t)n * k); w.scales.resize((size_t)n * w.nb * 8); w.mins.resize((size_t)n * w.nb * 8);
  w.d.resize((size_t)n * w.nb); w.dmin.resize((size_t)n * w.nb);
  for (auto& c : w.codes) c = rng() & 15;
  for (auto& s : w.scales) s = rng() & 63;
  for (auto& s : w.mins) s = rng() & 63;
  for (auto& v : w.d) v = _cvtsh_ss(_cvtss_sh((rng() % 1000) * 1e-5f, 0));
  for (auto& v : w.dmin) v = _cvtsh_ss(_cvtss_sh((rng() % 1000) * 1e-5f, 0));
  std::vector<int8_t> x(k); for (auto& v : x) v = (int8_t)((int)(rng() % 255) - 127);
  std::vector<float> dx(w.nb, 0.01f);
  std::vector<int16_t> xs(w.nb * 8);
  for (int b = 0; b < w.nb; ++b) for (int j = 0; j < 8; ++j) { int s = 0; for (int i = 0; i < 32; ++i) s += x[b * QK + 32 * j + i]; xs[b * 8 + j] = (int16_t)s; }
  Packed p = pack(w);
  // check integer sums against scalar
  std::vector<int32_t> S(8 * w.nb); std::vector<float> out(n);
  long bad = 0;
  for (int g = 0; g < p.groups; ++g) {
    group_dot(&p.bytes[(size_t)g * p.nb * Packed::kBlock], p.nb, x.data(), dx.data(), xs.data(), &out[8 * g], S.data());
    for (int b = 0; b < w.nb; ++b) for (int r = 0; r < 8; ++r) {
      long ref = 0; int row = 8 * g + r;
      for (int v = 0; v < QK; ++v) ref += (long)w.scales[((size_t)row * w.nb + b) * 8 + v / 32] * w.codes[((size_t)row * w.nb + b) * QK + v] * x[b * QK + v];
      if (ref != S[8 * b + r]) ++bad;
    }
  }
  printf("integer sums wrong: %ld of %d\n", bad, n * w.nb);
  if (bad) return 1;
  const size_t gguf_bytes = (size_t)n * w.nb * 144;
  auto t0 = std::chrono::steady_clock::now();
  for (int rep = 0; rep < reps; ++rep)
    for (int g = 0; g < p.groups; ++g)
      group_dot(&p.bytes[(size_t)g * p.nb * Packed::kBlock], p.nb, x.data(), dx.data(), xs.data(), &out[8 * g], nullptr);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("%dx%d interleaved: %.3f ms a call, %.1f GB/s of Q4_K bytes (packed %.0f%% of the file's)\n", n, k, s / reps * 1e3,
         gguf_bytes * (double)reps / s / 1e9, 100.0 * p.bytes.size() / gguf_bytes);
  std::vector<float> ob((size_t)8 * n);
  double m1 = time_rows<1>(p, x.data(), dx.data(), xs.data(), ob, reps);
  double m2 = time_rows<2>(p, x.data(), dx.data(), xs.data(), ob, reps);
  double m3 = time_rows<3>(p, x.data(), dx.data(), xs.data(), ob, reps);
  double m5 = time_rows<5>(p, x.data(), dx.data(), xs.data(), ob, reps);
  // the multi-row path's first row equals the one-row path's output
  std::vector<float> one(n); 
  for (int g = 0; g < p.groups; ++g) group_dot(&p.bytes[(size_t)g * p.nb * Packed::kBlock], p.nb, x.data(), dx.data(), xs.data(), &one[8 * g], nullptr);
  int diff = 0;
  for (int i = 0; i < n; ++i) diff += memcmp(&one[i], &ob[i], 4) != 0;
  printf("rows 1/2/3/5: %.3f / %.3f / %.3f / %.3f ms (5 rows = %.2fx one); multi-row row 0 bits differ at %d of %d\n", m1, m2, m3, m5, m5 / m1, diff, n);
  volatile float sink = out[0]; (void)sink;
}
