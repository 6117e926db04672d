#pragma once
// The AVX2 build of XXH3-64 (xxh3_avx2.cpp), present only with the x86 kernels.
#include <cstddef>
#include <cstdint>

namespace kbcore {

/// XXH3-64 (seed 0) of n bytes; the CPU must have AVX2. O(n).
std::uint64_t xxh3_64_avx2(const void* data, std::size_t n);

}  // namespace kbcore
