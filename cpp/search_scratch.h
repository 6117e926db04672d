#pragma once
// The per-thread scratch of every search: the buffers a search reuses so that it allocates
// nothing in steady state. One instance per thread, reached through search_scratch(), an
// out-of-line call: a search then holds a plain reference, where a thread_local named in its
// hot loop is re-resolved (a __tls_get_addr call in a shared library) at nearly every use.
// Each member belongs to one function, none of which is reentrant on one thread.
#include <cstdint>
#include <vector>

#include "code_types.h"
#include "grouping.h"
#include "slot.h"
#include "topk.h"

namespace kbcore {

struct SearchScratch {
  std::vector<Scored> layer_candidates;    // HnswIndex::search_layer (construction): the frontier
  std::vector<std::uint32_t> layer_links;  // HnswIndex::search_layer: a list copied under its lock
  std::vector<Scored> expand_candidates;   // GraphSearch::expanding: the frontier
  std::vector<Scored> expand_deferred;     // ... nodes scored but not admitted yet
  std::vector<Scored> expand_again;        // ... the deferred nodes being re-offered
  detail::GroupingScratch grouping;        // collapse_sorted, count_groups, collapse_exact
  GroupedSlots groups;                     // Index::search_groups: one query's groups
  std::vector<float> bm25_acc;             // Bm25Index::search: score per slot, 0 = untouched
  std::vector<Slot> bm25_touched;          // Bm25Index::search: the slots with a score
  CodeQueries code_queries;                // HnswCodeSearch::search / search_expanding, scan_slots_codes:
                                           // one prepared query per code type (code_query());
                                           // none calls another while it holds the query
  std::vector<Scored> walk_candidates;     // GraphSearch::layer0: the frontier
  std::vector<Scored> walk_pool;           // GraphSearch::layer0_pool: the sorted list of the ef best
  std::vector<std::uint8_t> walk_open;     // ... and per entry, 1 until it is expanded
  std::vector<Scored> probe_met;           // GraphSearch::near_rows_pass: every node it scored
  std::vector<Slot> rerank_slots;          // rerank_exact / rerank_bounded: the candidates' slots
  std::vector<float> rerank_dists;         // rerank_exact / rerank_bounded: their exact distances
  // GraphSearch::layer0 with a filter and GraphSearch::expanding with `allowed`: when set
  // (> 0), near_probe_failed is set if fewer than this fraction of the nearest nodes the walk
  // or its probe met pass (Index::search sets it around one call; docs/filter-ir.md).
  double near_probe_floor = 0.0;
  bool near_probe_failed = false;
};

/// The prepared query of code type Codes in scratch s.
template <typename Codes>
typename CodeTraits<Codes>::Query& code_query(SearchScratch& s) {
  return std::get<typename CodeTraits<Codes>::Query>(s.code_queries);
}

/// This thread's SearchScratch.
SearchScratch& search_scratch();

}  // namespace kbcore
