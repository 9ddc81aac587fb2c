// How the CPU linear kernels walk an output O[M, N] in tiles of NR weight rows x MR input rows,
// whatever a tile computes: the fp32-input tiles of the bf16 and int8 kernels (fp32_tiles.h) and
// the int16-input ones (quant_linear/int16_inputs*.h). A tile type provides
//
//   template <int NR, int MR> void run(int64_t m, int64_t n, int64_t n_end, P prefetch) const;
//
// computing O's rows m .. m+MR-1 at columns n .. n+NR-1, and fetching the next tile's weight rows
// ahead when ``prefetch`` (where n + 2 * NR <= n_end). The walkers pass ``prefetch`` on as they
// got it: a bool, or std::true_type / std::false_type for tiles that take it at compile time
// (their inner loop then carries no test for it).
#pragma once
#include <ATen/Parallel.h>
#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace tandem_tiles {

using NoPrefetch = std::false_type;
using Prefetch = std::true_type;

// Weight rows n0 .. n1-1 in groups of NR against input rows m0 .. in chunks of MR1, MRS... rows,
// one chunk after the other: no tile of many rows fits the registers, and later chunks find the
// group's weights in L1, so only the first prefetches. The n1 - n0 mod NR weight rows left run
// one at a time, without prefetching.
template <int NR, int MR1, int... MRS, typename Tile, typename P>
inline void split_rows(const Tile& tile, int64_t m0, int64_t n0, int64_t n1, P prefetch) {
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) {
    tile.template run<NR, MR1>(m0, n, n1, prefetch);
    int64_t m = m0 + MR1;
    ((tile.template run<NR, MRS>(m, n, n1, NoPrefetch{}), m += MRS), ...);
  }
  for (; n < n1; ++n) {
    tile.template run<1, MR1>(m0, n, n1, NoPrefetch{});
    int64_t m = m0 + MR1;
    ((tile.template run<1, MRS>(m, n, n1, NoPrefetch{}), m += MRS), ...);
  }
}

// Input rows m .. m+MR-1 against weight rows n0 .. n1-1.
template <int NR, int MR, typename Tile, typename P>
inline void rows(const Tile& tile, int64_t m, int64_t n0, int64_t n1, P prefetch) {
  split_rows<NR, MR>(tile, m, n0, n1, prefetch);
}

// Items (weight rows, panels) 0 .. count-1 shared out across threads, at least ``grain`` to a
// thread, each thread's share walked in blocks of ``block``: body(i0, i1) per block.
template <typename Body>
inline void parallel_blocks(int64_t count, int64_t grain, int64_t block, const Body& body) {
  at::parallel_for(0, count, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i0 = begin; i0 < end; i0 += block) body(i0, std::min(i0 + block, end));
  });
}

// The fewest items worth waking a thread for: ~32 KB of weights (``bytes`` each), at least
// ``at_least``.
inline int64_t grain(int64_t bytes, int64_t at_least) {
  return std::max<int64_t>(at_least, (32 << 10) / std::max<int64_t>(bytes, 1));
}

}  // namespace tandem_tiles
