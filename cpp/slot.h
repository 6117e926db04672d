#pragma once
// The core vocabulary type: a row's position in the VectorStore, which every index structure
// (graph, metadata, BM25, bitmaps) uses as its row number.
#include <cstdint>

namespace kbcore {

/// Index of a row in the VectorStore (stable while the row lives; reused after removal).
using Slot = std::uint32_t;
/// No slot (an empty IdMap bucket, a graph without entry point).
inline constexpr Slot kNoSlot = 0xFFFFFFFFu;

}  // namespace kbcore
