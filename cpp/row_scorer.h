#pragma once
// RowScorer: the Scorer (graph_search.h) of float32 rows, bound to one prepared query.
#include <algorithm>
#include <cstdint>

#include "distance.h"
#include "prefetch.h"
#include "slot.h"
#include "vector_store.h"

namespace kbcore {

/// Exact distances from one prepared query (normalised for cosine) to stored float32 rows.
/// Holds references: the store and the query must outlive it. Thread-safe (const).
class RowScorer {
 public:
  RowScorer(const VectorStore& store, Metric metric, const Kernels& kernels, const float* q)
      : store_(store), kernels_(kernels), metric_(metric), q_(q), dim_(store.dim()) {}

  /// Distance to one slot (the one-row kernel). O(dim).
  float one(Slot s) const { return distance(kernels_, metric_, q_, store_.vector(s), dim_); }
  /// Distances to slots[0..m) into out, four rows at a time (independent dot products keep
  /// the FMA units busy); a tail of 1-3 rows is padded by repeating its last row, so every
  /// row goes through the same four-row kernel. Callers prefetch the rows first. O(m * dim).
  void block(const std::uint32_t* slots, std::size_t m, float* out) const {
    for (std::size_t j = 0; j < m; j += 4) {
      const std::size_t last = m - 1;
      const float* rows[4] = {store_.vector(slots[j]), store_.vector(slots[std::min(j + 1, last)]),
                              store_.vector(slots[std::min(j + 2, last)]), store_.vector(slots[std::min(j + 3, last)])};
      if (j + 4 <= m) {
        distance4(kernels_, metric_, q_, rows, dim_, out + j);
      } else {
        float tail[4];
        distance4(kernels_, metric_, q_, rows, dim_, tail);
        for (std::size_t t = j; t < m; ++t) out[t] = tail[t - j];
      }
    }
  }
  /// Starts loading the whole row of s into L2 (prefetch_row_l2, which has the figures).
  void prefetch(Slot s) const { prefetch_row_l2(store_.vector(s), dim_ * sizeof(float)); }

 private:
  const VectorStore& store_;
  const Kernels& kernels_;
  Metric metric_;
  const float* q_;
  std::size_t dim_;
};

}  // namespace kbcore
