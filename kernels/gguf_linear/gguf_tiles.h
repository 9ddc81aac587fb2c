// The walk over the output shared by both tile sets (no #pragma once: gguf_formats_avx2.h and
// gguf_formats_vnni.h include it inside their own namespace and target, so that it inlines their
// block functions). A format F (one per GGUF type) provides
//
//   kValues, kBytes: a block's values and bytes;  kOffset: c such that S -= c * xs32 (a code
//   offset that is the same for every weight row);  kMins: 0 none, 1 mins per weight row
//   (Q4_K, Q5_K: F gives the row's 8 mins as int16), 2 the input block sums times m (Q4_1, Q5_1);
//   kHalves: the byte offset in a block of a 32-bit word holding its fp16 scale d (its high half
//   where kDHigh, else its low half) and its offset scale in the high half (o = -dmin for
//   K-quants, kNegate, +m for Q4_1 / Q5_1), read for the 8 rows at once;
//   sums<MR>(blk, in, b, m0, s, mins, stride): for input rows m0 .. m0+MR-1, the int32 lanes whose
//   sum is S of block b of one weight row, at s[r * stride] (and its mins at *mins); or, where
//   kWholeTile, tile_sums<MR>(rows, b, in, m0, S): S itself for the 8 rows at once.
//
// The including header names its format for each type Q40, Q41, Q50, Q51, Q80, Q4K, Q5K, Q6K
// (``dispatch`` picks one per GGUF type).
//
// A tile is 8 weight rows (the 8 fp32 lanes) x MR input rows. Per block, the integer lanes are
// summed exactly to one S (and Mn) per (weight row, input row), then the fp32 steps of
// reference.py run on the 8 weight rows at once, in block order. Every value is exact or one
// rounding of an exact value, so the tiling (rows per call, tile set) never changes a bit.

constexpr int kRows = 8;

// v[0..7]: 8 int32 lanes each -> one vector holding each one's lane sum, in order (exact).
inline __m256i sum_lanes8(const __m256i* v) {
  const __m256i s0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  const __m256i s4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(s0123, s4567, 0x20), _mm256_permute2x128_si256(s0123, s4567, 0x31));
}

inline __m256i reduce_lanes(const __m256i* v) { return sum_lanes8(v); }

// What a format's sums() leaves per (input row, weight row): 8 int32 lanes, or the format's own
// ``Lanes`` (the VNNI K-quants: 16, summed together with the other rows' in reduce_lanes).
template <class F, class = void>
struct LanesOf { using type = __m256i; };
template <class F>
struct LanesOf<F, std::void_t<typename F::Lanes>> { using type = typename F::Lanes; };

// mins[0..7]: 8 rows' 8 int16 mins -> 4 vectors, vector k holding each row's mins 2k, 2k+1 (a
// transpose of 32-bit words), so that Mn for the 8 rows is 4 vpmaddwd against the input sums.
inline void transpose_mins(const __m128i* mins, __m256i* w) {
  __m256i y[4];
  for (int i = 0; i < 4; ++i) y[i] = _mm256_set_m128i(mins[i + 4], mins[i]);
  const __m256i t0 = _mm256_unpacklo_epi32(y[0], y[1]), t1 = _mm256_unpackhi_epi32(y[0], y[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(y[2], y[3]), t3 = _mm256_unpackhi_epi32(y[2], y[3]);
  w[0] = _mm256_unpacklo_epi64(t0, t2);
  w[1] = _mm256_unpackhi_epi64(t0, t2);
  w[2] = _mm256_unpacklo_epi64(t1, t3);
  w[3] = _mm256_unpackhi_epi64(t1, t3);
}

// Mn = sum_j mins_j * xs32_j for the 8 rows (exact), xs: the block's 8 input sums.
inline __m256i mins_dot(const __m256i* w, const int16_t* xs) {
  int32_t pairs[4];
  std::memcpy(pairs, xs, 16);
  __m256i acc = _mm256_madd_epi16(w[0], _mm256_set1_epi32(pairs[0]));
  for (int k = 1; k < 4; ++k) acc = _mm256_add_epi32(acc, _mm256_madd_epi16(w[k], _mm256_set1_epi32(pairs[k])));
  return acc;
}

struct Job {
  const uint8_t* W;  // [N][row_bytes]: the file's rows
  int64_t row_bytes, N;
  const Inputs* in;
  const float* B;  // bias [N] or null
  float* O;        // [M][ldo]: row m's N outputs at O + m * ldo
  int64_t ldo;     // N, or more where several weights' outputs share one row (run_group)
  const uint8_t* P = nullptr;  // the same weight laid out again at load for this tile set, or null
};

// A tile set that lays a type out again at load (gguf_rows8_avx2.h) computes a job whose
// weights it packed (job.P) on its own tiles: tile t (weight rows 8t .. 8t+7) against M input
// rows; false where it packs no such type.
inline bool packed_column(int64_t qtype, const Job& job, int64_t t, int64_t M);

// acc[r] (+ the bias) -> the outputs of weight rows n0 .. n0+7 (those below N) for input row m0 + r.
template <int MR>
inline void store_tile(const __m256* acc, const Job& job, int64_t n0, int64_t m0) {
  const int64_t valid = std::min<int64_t>(kRows, job.N - n0);
  alignas(32) float bias[kRows] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (job.B)
    for (int64_t i = 0; i < valid; ++i) bias[i] = job.B[n0 + i];
  for (int r = 0; r < MR; ++r) {
    const __m256 y = job.B ? _mm256_add_ps(acc[r], _mm256_load_ps(bias)) : acc[r];
    float* out = job.O + (m0 + r) * job.ldo + n0;
    if (valid == kRows) {
      _mm256_storeu_ps(out, y);
    } else {
      alignas(32) float lanes[kRows];
      _mm256_store_ps(lanes, y);
      for (int64_t i = 0; i < valid; ++i) out[i] = lanes[i];
    }
  }
}

template <class F, int MR>
inline void tile(const Job& job, int64_t n0, int64_t m0, bool prefetch) {
  const Inputs& in = *job.in;
  const int64_t blocks = in.K / F::kValues;
  const uint8_t* rows[kRows];
  for (int i = 0; i < kRows; ++i) rows[i] = job.W + std::min<int64_t>(n0 + i, job.N - 1) * job.row_bytes;
  __m256 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
  typename LanesOf<F>::type s[MR][kRows];
  __m128i mins[kRows];
  alignas(32) int32_t apart[kRows];  // the rows' distances from the first, for the gather
  for (int i = 0; i < kRows; ++i) apart[i] = static_cast<int32_t>(rows[i] - rows[0]);
  const __m256i offsets = _mm256_load_si256(reinterpret_cast<const __m256i*>(apart));
  for (int64_t b = 0; b < blocks; ++b) {
    // The next tile's rows follow these in the file: fetch their blocks now, so that memory
    // streams while this one computes (8 rows' blocks are 8 short strides, which the hardware
    // prefetcher alone follows poorly). One address per 64 bytes back from a block's last byte
    // reaches every line it touches (a legacy block's end is within 64 bytes of the last one's).
    // Into L2, not L1: a core has only a few L1 miss buffers, and 24 lines a block in flight to
    // L1 held a 2-thread decode pass of the default target at ~16 GB/s; to L2 it streams ~32
    // (60 -> 30 ms a pass, AMD EPYC with AVX-512 VNNI), and L2 to L1 is a short wait.
    if (prefetch)
      for (int i = 0; i < kRows; ++i) {
        const char* next = reinterpret_cast<const char*>(rows[i] + b * F::kBytes) + kRows * job.row_bytes;
        for (int l = F::kBytes - 1; l >= 0; l -= 64) _mm_prefetch(next + l, _MM_HINT_T1);
      }
    __m256i S[MR];
    if constexpr (F::kWholeTile) {
      F::template tile_sums<MR>(rows, b, in, m0, S);
    } else {
#pragma GCC unroll 8
      for (int i = 0; i < kRows; ++i) F::template sums<MR>(rows[i] + b * F::kBytes, in, b, m0, &s[0][i], &mins[i], kRows);
      for (int r = 0; r < MR; ++r) S[r] = reduce_lanes(s[r]);
    }
    // The 8 rows' fp16 scales in one gather: [low halves | high halves] -> fp32.
    const __m256i word = _mm256_i32gather_epi32(reinterpret_cast<const int*>(rows[0] + b * F::kBytes + F::kHalves), offsets, 1);
    const __m256i halves = _mm256_permute4x64_epi64(
        _mm256_packus_epi32(_mm256_and_si256(word, _mm256_set1_epi32(0xFFFF)), _mm256_srli_epi32(word, 16)), 0xD8);
    const __m256 low = _mm256_cvtph_ps(_mm256_castsi256_si128(halves)), high = _mm256_cvtph_ps(_mm256_extracti128_si256(halves, 1));
    const __m256 dv = F::kDHigh ? high : low;
    const __m256 ov = F::kNegate ? _mm256_xor_ps(high, _mm256_set1_ps(-0.0f)) : high;
    __m256i mins_t[4];
    if constexpr (F::kMins == 1) transpose_mins(mins, mins_t);
    for (int r = 0; r < MR; ++r) {
      if constexpr (F::kOffset != 0) S[r] = _mm256_sub_epi32(S[r], _mm256_set1_epi32(F::kOffset * in.sums32(m0 + r)[b]));
      const __m256 dxv = _mm256_set1_ps(in.scale(m0 + r, b));
      __m256 t = _mm256_mul_ps(_mm256_mul_ps(dv, dxv), _mm256_cvtepi32_ps(S[r]));
      if constexpr (F::kMins == 1)
        t = _mm256_add_ps(t, _mm256_mul_ps(_mm256_mul_ps(ov, dxv), _mm256_cvtepi32_ps(mins_dot(mins_t, in.sums32(m0 + r) + b * 8))));
      if constexpr (F::kMins == 2)
        t = _mm256_add_ps(t, _mm256_mul_ps(_mm256_mul_ps(ov, dxv), _mm256_set1_ps(static_cast<float>(in.sums32(m0 + r)[b]))));
      acc[r] = _mm256_add_ps(acc[r], t);
    }
  }
  store_tile<MR>(acc, job, n0, m0);
}

template <class F, int MR = kMaxRows>
inline void tile_rows(int64_t count, const Job& job, int64_t n0, int64_t m0, bool prefetch) {
  if constexpr (MR > 1) {
    if (count < MR) return tile_rows<F, MR - 1>(count, job, n0, m0, prefetch);
  }
  tile<F, MR>(job, n0, m0, prefetch);
}

inline int64_t tile_count(const Job& job) { return (job.N + kRows - 1) / kRows; }

// Each thread gets at least ~32 KB of weights, enough to amortize waking it.
inline int64_t tile_grain(int64_t row_bytes) { return std::max<int64_t>(1, (32 << 10) / (kRows * row_bytes)); }

// Tile t of ``job`` (its weight rows 8t .. 8t+7) against all M input rows.
template <class F>
inline void column(const Job& job, int64_t t, int64_t M) {
  // Input rows in as few chunks as the registers allow, as even as possible (9 rows: 5 + 4).
  const int64_t chunks = (M + kMaxRows - 1) / kMaxRows;
  int64_t m = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t count = M / chunks + (c < M % chunks ? 1 : 0);
    // Later chunks find the tile's weights in L1/L2: only the first fetches ahead.
    tile_rows<F>(count, job, t * kRows, m, c == 0);
    m += count;
  }
}

// O = the linear of every input row against every weight row, tiles shared out across threads.
template <class F>
inline void run(const Job& job, int64_t M) {
  at::parallel_for(0, tile_count(job), tile_grain(job.row_bytes), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) column<F>(job, t, M);
  });
}

// column<F> for a GGUF type; false for a type these tiles do not cover.
inline bool column_of(int64_t qtype, const Job& job, int64_t t, int64_t M) {
  using namespace tandem_gguf;
  if (job.P) return packed_column(qtype, job, t, M);
  switch (qtype) {
    case Q4_0: column<Q40>(job, t, M); return true;
    case Q4_1: column<Q41>(job, t, M); return true;
    case Q5_0: column<Q50>(job, t, M); return true;
    case Q5_1: column<Q51>(job, t, M); return true;
    case Q8_0: column<Q80>(job, t, M); return true;
    case Q4_K: column<Q4K>(job, t, M); return true;
    case Q5_K: column<Q5K>(job, t, M); return true;
    case Q6_K: column<Q6K>(job, t, M); return true;
    default: return false;
  }
}

// Several weights on the same input rows (a layer's q, k and v; its gate and up) in one
// parallel region: their tiles one after the other, shared out as one range. A decode step
// pays a thread wake-up and a call per region, ~3 of 7 a layer saved. Each tile computes exactly
// what ``run`` does. False (nothing computed) if a type is not covered.
inline bool run_group(const Job* jobs, const int64_t* qtypes, int64_t count, int64_t M) {
  constexpr int64_t kMaxGroup = 8;
  if (count < 1 || count > kMaxGroup) return false;
  int64_t start[kMaxGroup + 1] = {0};
  int64_t bytes = 0;
  for (int64_t j = 0; j < count; ++j) {
    switch (qtypes[j]) {
      case tandem_gguf::Q4_0: case tandem_gguf::Q4_1: case tandem_gguf::Q5_0: case tandem_gguf::Q5_1:
      case tandem_gguf::Q8_0: case tandem_gguf::Q4_K: case tandem_gguf::Q5_K: case tandem_gguf::Q6_K: break;
      default: return false;
    }
    start[j + 1] = start[j] + tile_count(jobs[j]);
    bytes += jobs[j].N * jobs[j].row_bytes;
  }
  const int64_t tiles = start[count];
  if (tiles == 0) return true;
  const int64_t mean_row_bytes = std::max<int64_t>(1, bytes / std::max<int64_t>(1, tiles * kRows));
  at::parallel_for(0, tiles, tile_grain(mean_row_bytes), [&](int64_t t0, int64_t t1) {
    int64_t j = 0;
    for (int64_t t = t0; t < t1; ++t) {
      while (t >= start[j + 1]) ++j;
      column_of(qtypes[j], jobs[j], t - start[j], M);
    }
  });
  return true;
}

// Runs ``job`` for a GGUF type; false for a type these tiles do not cover.
inline bool dispatch(int64_t qtype, const Job& job, int64_t M) {
  using namespace tandem_gguf;
  if (job.P) return run_group(&job, &qtype, 1, M);
  switch (qtype) {
    case Q4_0: run<Q40>(job, M); return true;
    case Q4_1: run<Q41>(job, M); return true;
    case Q5_0: run<Q50>(job, M); return true;
    case Q5_1: run<Q51>(job, M); return true;
    case Q8_0: run<Q80>(job, M); return true;
    case Q4_K: run<Q4K>(job, M); return true;
    case Q5_K: run<Q5K>(job, M); return true;
    case Q6_K: run<Q6K>(job, M); return true;
    default: return false;
  }
}
