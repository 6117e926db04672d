#pragma once
// Search planning: the strategies a filtered search can take, the cost model that picks one
// (choose_strategy), the measured graph work it is fed (EvalStats), and the parameters of a
// search as the binding passes them (SearchParams, GroupParams, after faiss's SearchParameters).
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace kbcore {

struct FilterNode;

/// kAuto lets the cost model choose. kExact scans the passing rows. kTwoHop is the two-hop
/// traversal that scores passing rows only (for selective filters); kFilteredWalk is the plain
/// traversal that scores every node it meets and admits passing ones to the results (for wide
/// filters, where most neighbours pass anyway).
enum class Strategy : std::uint8_t { kAuto = 0, kExact = 1, kTwoHop = 2, kFilteredWalk = 3 };

/// One k-NN search call. ef = 0 uses the index's ef_search; threads = 0 uses all cores;
/// `filter` (borrowed, may be null) restricts results to rows whose metadata passes it;
/// `force` overrides the cost model (benchmarks and tests).
struct SearchParams {
  std::size_t k = 10;
  std::size_t ef = 0;
  std::size_t threads = 0;
  const FilterNode* filter = nullptr;
  Strategy force = Strategy::kAuto;
};

/// A grouped search: up to k groups of the int or str field `group_by`, each with its best
/// `group_size` hits.
struct GroupParams : SearchParams {
  std::string group_by;
  std::size_t group_size = 1;
};

/// The two-hop traversal's near probe (GraphSearch::near_rows_pass): a query whose 64 nearest
/// rows the probe meets pass less than this fraction of the selectivity is answered by the
/// exact scan (the passing rows lie away from the query; docs/filter-ir.md, "Far passing
/// rows"). On the far-rows sets, 15-29 % passing, such queries pass about 1 in 50 of their
/// nearest rows, uncorrelated ones about `sel`; at 0.4 and 64 rows an uncorrelated filter
/// trips it with binomial odds 0.9 % at 15 % passing, 0.7 % at 20 %, 0.15 % at 25 %.
inline constexpr double kTwoHopProbeRatio = 0.4;
/// The filtered walk's near probe (GraphSearch::layer0): a query whose walk finds fewer than
/// this fraction of the selectivity passing among the first nodes it expands (about its
/// nearest rows) is answered by the exact scan (docs/filter-ir.md, "Far passing rows"). On the
/// far-rows sets, 35-50 % passing, such queries pass about 1 in 50 of them, uncorrelated ones
/// about `sel`; at 0.25 and 32 nodes, a 30 % uncorrelated filter trips it with odds ~0.1 %.
inline constexpr double kNearProbeRatio = 0.25;
/// Below this passing fraction a filtered search always scans the passing rows exactly (the
/// floor of choose_strategy), so the filter evaluation hands over their list at once.
inline constexpr double kRowsListFraction = 0.15;

/// Distance evaluations per unit of ef of recent unfiltered graph searches: an exponential
/// average, updated after each batch. Thread-safe (relaxed atomics: a lost update only
/// delays the average).
class EvalStats {
 public:
  /// The current average.
  double per_ef() const { return static_cast<double>(x1024_.load(std::memory_order_relaxed)) / 1024.0; }
  /// Folds in a batch of nq searches at this ef that made `evals` evaluations in all; a batch
  /// weighs 5 % per query, up to replacing the average.
  void record(std::uint64_t evals, std::size_t nq, std::size_t ef);

 private:
  std::atomic<std::uint64_t> x1024_{12 * 1024};  // in 1/1024 units; 12 until measured
};

/// The strategy for `passing` rows out of `live` at this ef, given the measured graph work.
/// kExact without a graph. O(1).
Strategy choose_strategy(bool has_graph, std::size_t passing, std::size_t live, std::size_t ef, double evals_per_ef);

}  // namespace kbcore
