// Slot orders for locality and the renumbering of a graph and its rows (graph_reorder.h).
//
// Coleman et al. (NeurIPS 2022) found breadth-first and Cuthill-McKee orders of an HNSW graph
// close to the best (Gorder) at a fraction of the cost: the walk reads a node's neighbours'
// rows right after its own, and in those orders they sit a few slots apart, so fewer pages and
// fewer lines of the caches' sets are touched per query.
#include <algorithm>
#include <cstring>
#include <deque>

#include "errors.h"
#include "hnsw_index.h"
#include "index.h"
#include "parallel.h"
#include "vector_store.h"

namespace kbcore {

ReorderMethod parse_reorder_method(const std::string& name) {
  if (name == "bfs") return ReorderMethod::kBfs;
  if (name == "rcm") return ReorderMethod::kRcm;
  throw InvalidArgument("unknown reorder method '" + name + "': expected 'bfs' or 'rcm'");
}

SlotPermutation make_permutation(std::vector<Slot> new_to_old) {
  SlotPermutation p;
  p.old_to_new.assign(new_to_old.size(), kNoSlot);
  for (std::size_t i = 0; i < new_to_old.size(); ++i) {
    const Slot o = new_to_old[i];
    if (o >= new_to_old.size() || p.old_to_new[o] != kNoSlot) {
      throw InvalidArgument("slot order is not a permutation: slot " + std::to_string(o) + " at position " +
                            std::to_string(i));
    }
    p.old_to_new[o] = static_cast<Slot>(i);
  }
  p.new_to_old = std::move(new_to_old);
  return p;
}

std::vector<Slot> HnswIndex::locality_order(ReorderMethod method) const {
  const std::size_t n = levels_.size();
  std::vector<Slot> order;
  order.reserve(n);
  std::vector<std::uint8_t> seen(n, 0);
  std::vector<Slot> nbrs;
  const auto degree = [&](Slot s) { return links(s, 0)[0]; };
  // Breadth-first over level 0 from the entry point: the slots the walk reaches. Cuthill-McKee
  // visits a node's neighbours by ascending degree (George & Liu 1981), then the whole order is
  // reversed, so that the low-degree leaves of one level come before the nodes that reach them.
  if (entry_ != kNoSlot) {
    seen[entry_] = 1;
    order.push_back(entry_);
    for (std::size_t head = 0; head < order.size(); ++head) {
      const std::uint32_t* l = links(order[head], 0);
      nbrs.assign(l + 1, l + 1 + l[0]);
      if (method == ReorderMethod::kRcm) {
        std::stable_sort(nbrs.begin(), nbrs.end(), [&](Slot a, Slot b) { return degree(a) < degree(b); });
      }
      for (const Slot t : nbrs) {
        if (seen[t]) continue;
        seen[t] = 1;
        order.push_back(t);
      }
    }
    if (method == ReorderMethod::kRcm) std::reverse(order.begin(), order.end());
  }
  // Free and pending slots (not linked) and anything unreachable keep their relative order.
  for (std::size_t s = 0; s < n; ++s) {
    if (!seen[s]) order.push_back(static_cast<Slot>(s));
  }
  return order;
}

void HnswIndex::permute_slots(const SlotPermutation& p) {
  const std::size_t n = levels_.size();
  if (p.new_to_old.size() != n) throw InvalidArgument("slot permutation size differs from the graph's slots");
  const std::size_t w0 = 1 + m0_;
  const std::size_t wu = 1 + params_.M;
  const std::uint32_t* old0 = links0_.data();
  MappedArray<std::uint32_t> links0;
  links0.resize(n * w0, 0);
  std::uint32_t* new0 = links0.mutable_data();
  std::vector<std::uint16_t> core0(n);
  std::vector<std::uint8_t> levels(n);
  std::vector<std::unique_ptr<std::uint32_t[]>> upper(n);
  std::vector<std::uint8_t> pending(n);
  for (std::size_t i = 0; i < n; ++i) {
    const Slot o = p.new_to_old[i];
    const std::uint32_t* src = old0 + static_cast<std::size_t>(o) * w0;
    std::uint32_t* dst = new0 + i * w0;
    dst[0] = src[0];
    for (std::uint32_t j = 1; j <= src[0]; ++j) dst[j] = p.old_to_new[src[j]];
    core0[i] = core0_[o];
    levels[i] = levels_[o];
    pending[i] = pending_[o];
    upper[i] = std::move(upper_[o]);
    if (upper[i]) {
      for (std::size_t l = 0; l < levels[i]; ++l) {
        std::uint32_t* list = upper[i].get() + l * wu;
        for (std::uint32_t j = 1; j <= list[0]; ++j) list[j] = p.old_to_new[list[j]];
      }
    }
  }
  links0_ = std::move(links0);
  core0_ = std::move(core0);
  levels_ = std::move(levels);
  upper_ = std::move(upper);
  pending_ = std::move(pending);
  for (Slot& s : pending_list_) s = p.old_to_new[s];
  std::sort(pending_list_.begin(), pending_list_.end());
  if (entry_ != kNoSlot) entry_ = p.old_to_new[entry_];
}

void VectorStore::permute_slots(const SlotPermutation& p) {
  const std::size_t n = slot_ids_.size();
  if (p.new_to_old.size() != n) throw InvalidArgument("slot permutation size differs from the store's slots");
  AlignedVector<float> rows(n * dim_);
  std::vector<std::int64_t> ids(n);
  std::vector<std::uint8_t> live(n);
  for (std::size_t i = 0; i < n; ++i) {
    const Slot o = p.new_to_old[i];
    std::memcpy(rows.data() + i * dim_, vector(o), dim_ * sizeof(float));
    ids[i] = slot_ids_[o];
    live[i] = live_[o];
  }
  restore_slots(std::move(ids), std::move(live));
  // Written back through data_ (not assigned), so rows on disk stay on disk.
  if (n > 0) std::memcpy(data_.data(), rows.data(), rows.size() * sizeof(float));
}

void Index::reorder(const std::string& method, std::size_t threads) {
  const ReorderMethod m = parse_reorder_method(method);
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (!graph_) throw InvalidArgument("reorder needs an hnsw index: a flat index has no graph to follow");
  if (!meta_.empty() || text_.documents() != 0 || !graph_->pending().empty()) {
    throw InvalidArgument("reorder (trial) supports indexes without metadata, text or pending rows only");
  }
  const SlotPermutation p = make_permutation(graph_->locality_order(m));
  store_.permute_slots(p);
  graph_->permute_slots(p);
  if (codes_trained()) {
    // Encoding is a function of the row and the trained parameters: the same codes, moved.
    std::vector<Slot> live;
    live.reserve(store_.size());
    store_.live_bitmap().for_each([&](Slot s) { live.push_back(s); });
    update_codes_locked(live, threads);
  }
  store_.release_resident_rows();
}

}  // namespace kbcore
