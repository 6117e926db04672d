// XXH3-64 compiled with AVX2 (-mavx2 for this file only; binary_io.cpp calls it only when the
// CPU has AVX2): xxHash's vector paths give the same hash bit for bit as its portable SSE2 one,
// at about twice its speed (a reopen hashes every byte of the index file, issue 28).
#include "xxh3_avx2.h"

// XXH3 (third_party/xxhash, BSD-2-Clause), inlined into this file only.
#define XXH_INLINE_ALL
#include "xxhash.h"

namespace kbcore {

std::uint64_t xxh3_64_avx2(const void* data, std::size_t n) { return XXH3_64bits(data, n); }

}  // namespace kbcore
