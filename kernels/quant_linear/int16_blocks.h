// What the two tile sets of int8 weights x int16-quantized inputs share (the AVX2 tiles,
// int16_inputs.h, and the AVX-512 VNNI ones, int16_inputs_vnni.h): the input blocks, the
// buffers a tile reads and the flush of a block's integer sums.
#pragma once
#include <cstdint>

namespace tandem_int16 {

constexpr int64_t kBlock = 256;  // inputs per scale; a power of two, a multiple of 32
// Exact int32 sums: a block adds at most kBlock/2 products pairs per lane of |q| <= 127 times
// |x| <= 32767, 2^31 / (2 * 127 * 32767) ~ 258 pairs.
static_assert(kBlock % 32 == 0 && (kBlock & (kBlock - 1)) == 0 && kBlock / 2 <= 258, "block");

inline int64_t blocks(int64_t K) { return (K + kBlock - 1) / kBlock; }

// The buffers of one call: quantized inputs X (row-major for the AVX2 tiles, step-major for
// the VNNI ones) and their scales XS [M, blocks(K)], weights W [N, K] and scales S [N], bias B
// (or nullptr), output O [M, N]. Each tile set's Tiles adds the run() that tandem_tiles' walkers
// call (tile_grid.h).
struct Buffers {
  const int16_t* X;
  const float* XS;
  const int8_t* W;
  const float* S;
  const float* B;
  float* O;
  int64_t M, K, N;
};

}  // namespace tandem_int16

// How a tile of NR weight rows x MR input rows sums, on BITS-wide vectors (256: int16_inputs.h,
// 512: int16_inputs_vnni.h): per output, int32 sums acc[i][j] of the block in hand (registers)
// and fp32 sums over the blocks so far (``sums``, BITS / 32 floats per output, in L1: in
// registers they would push the int32 sums out). Macros: with the flush as a loop of its own, a
// lambda or a function, GCC kept the int32 sums in memory (2x slower).

// Declares the tile's state: nb (blocks in K), sums (zero) and acc (zero).
#define TANDEM_INT16_TILE_STATE(BITS)                                                                \
  const int64_t nb = tandem_int16::blocks(K);                                                       \
  alignas(BITS / 8) float sums[NR * MR * (BITS / 32)] = {};                                         \
  __m##BITS##i acc[NR][MR];                                                                         \
  for (int i = 0; i < NR; ++i)                                                                      \
    for (int j = 0; j < MR; ++j) acc[i][j] = _mm##BITS##_setzero_si##BITS();

// Block b done: its int32 sums, scaled by its input scales XS, into the fp32 sums; the int32
// sums restart. The scale is broadcast as each tile set did on its own (AVX2 from memory with
// vbroadcastss: with _mm256_set1_ps GCC scheduled the AVX2 loop worse, ~5-10% slower).
#define TANDEM_INT16_BROADCAST_256(p) _mm256_broadcast_ss(p)
#define TANDEM_INT16_BROADCAST_512(p) _mm512_set1_ps(*(p))
#define TANDEM_INT16_FLUSH(BITS, b)                                                                  \
  for (int j = 0; j < MR; ++j) {                                                                    \
    const __m##BITS s_ = TANDEM_INT16_BROADCAST_##BITS(XS + (m + j) * nb + (b));                    \
    for (int i = 0; i < NR; ++i) {                                                                  \
      float* a_ = sums + (i * MR + j) * (BITS / 32);                                                \
      _mm##BITS##_store_ps(a_, _mm##BITS##_fmadd_ps(_mm##BITS##_cvtepi32_ps(acc[i][j]), s_, _mm##BITS##_load_ps(a_))); \
      acc[i][j] = _mm##BITS##_setzero_si##BITS();                                                   \
    }                                                                                               \
  }
