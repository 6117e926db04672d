#pragma once
// Slot reordering for locality (Coleman et al., "Graph Reordering for Cache-Efficient Near
// Neighbor Search", NeurIPS 2022): a built graph's slots are renumbered so that a node's
// neighbours get nearby slots, and so nearby rows, codes and link lists in memory. The graph,
// the answers and the external ids are unchanged; only where each row lives moves.
#include <cstdint>
#include <string>
#include <vector>

#include "slot.h"

namespace kbcore {

/// How a new slot order is computed from the level-0 graph (kGorder measured fastest).
enum class ReorderMethod : std::uint8_t {
  kBfs,  ///< breadth-first from the entry point, neighbours in link-list order
  kRcm,  ///< reverse Cuthill-McKee: breadth-first, neighbours by ascending degree, reversed
  /// Gorder's greedy window (Wei et al., SIGMOD 2016) on direct links only: the next slot goes
  /// to the unplaced node with the most links (either direction) to the last few placed
  kGorder,
};

/// Parses "bfs" | "rcm" | "gorder"; throws InvalidArgument otherwise.
ReorderMethod parse_reorder_method(const std::string& name);

/// A permutation of slots: new_to_old[i] is the old slot that becomes slot i, old_to_new its
/// inverse. Both have the slot count's entries.
struct SlotPermutation {
  std::vector<Slot> new_to_old;
  std::vector<Slot> old_to_new;
};

/// The inverse of new_to_old (which must be a permutation of 0..n-1; checked, InvalidArgument).
SlotPermutation make_permutation(std::vector<Slot> new_to_old);

}  // namespace kbcore
