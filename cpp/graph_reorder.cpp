// Slot orders for locality and the renumbering of a graph and its rows (graph_reorder.h).
//
// The walk reads a node's neighbours' code rows right after its own; when they sit a few slots
// apart they share pages (TLB entries) and the hardware prefetchers' streams. Coleman et al.
// (NeurIPS 2022) measured Gorder best on HNSW, breadth-first and Cuthill-McKee orders close.
// Here (docs/graph-quality.md) breadth-first and RCM were slower than the rows' own order on
// ArguAna chunks (rows stored by debate, already local) and Gorder's window was not: a BFS
// layer of a small-world graph spans the whole data set, so it scatters what was together.
#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <utility>

#include "bm25_index.h"
#include "errors.h"
#include "hnsw_index.h"
#include "index.h"
#include "mapped_array.h"
#include "metadata_store.h"
#include "parallel.h"
#include "vector_store.h"

namespace kbcore {

ReorderMethod parse_reorder_method(const std::string& name) {
  if (name == "bfs") return ReorderMethod::kBfs;
  if (name == "rcm") return ReorderMethod::kRcm;
  if (name == "gorder") return ReorderMethod::kGorder;
  throw InvalidArgument("unknown reorder method '" + name + "': expected 'bfs', 'rcm' or 'gorder'");
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

std::vector<Slot> HnswIndex::window_order(const std::vector<Slot>& reached) const {
  // Gorder (Wei et al., SIGMOD 2016) scores a candidate by its links to, and the in-neighbours
  // it shares with, the last w placed nodes; the shared in-neighbours cost O(degree^2) per node
  // and are left out here. Scores change by one per link as nodes enter and leave the window:
  // a max-heap with lazy deletion (an entry is valid while its score is the node's score).
  // Every placed node pushes an entry per link, so stale entries pile up (tens of millions at
  // 1M rows); the heap is pruned to its valid entries whenever it outgrows 4 entries per slot.
  constexpr std::size_t kWindow = 5;
  const std::size_t n = levels_.size();
  std::vector<std::uint32_t> in_begin(n + 1, 0);
  for (const Slot v : reached) {
    const std::uint32_t* l = links(v, 0);
    for (std::uint32_t j = 1; j <= l[0]; ++j) ++in_begin[l[j] + 1];
  }
  for (std::size_t i = 0; i < n; ++i) in_begin[i + 1] += in_begin[i];
  std::vector<Slot> in_links(in_begin[n]);
  std::vector<std::uint32_t> fill(in_begin.begin(), in_begin.end() - 1);
  for (const Slot v : reached) {
    const std::uint32_t* l = links(v, 0);
    for (std::uint32_t j = 1; j <= l[0]; ++j) in_links[fill[l[j]]++] = v;
  }
  std::vector<std::int32_t> score(n, 0);
  std::vector<std::uint8_t> placed(n, 0);
  using Entry = std::pair<std::int32_t, std::uint32_t>;  // (score, ~slot): lower slots first on ties
  std::vector<Entry> heap;                               // a max-heap (std::push_heap / pop_heap)
  const std::size_t heap_cap = 4 * reached.size() + 1024;
  const auto valid = [&](const Entry& e) {
    const Slot u = ~e.second;
    return !placed[u] && score[u] == e.first;
  };
  const auto bump = [&](Slot v, std::int32_t delta) {
    const auto touch = [&](Slot u) {
      if (placed[u]) return;
      score[u] += delta;
      if (score[u] <= 0) return;
      heap.push_back({score[u], ~u});
      std::push_heap(heap.begin(), heap.end());
    };
    const std::uint32_t* l = links(v, 0);
    for (std::uint32_t j = 1; j <= l[0]; ++j) touch(l[j]);
    for (std::uint32_t j = in_begin[v]; j < in_begin[v + 1]; ++j) touch(in_links[j]);
  };
  std::vector<Slot> order;
  order.reserve(reached.size());
  std::deque<Slot> window;
  std::size_t next_seed = 0;  // unplaced nodes restart from the breadth-first order
  while (order.size() < reached.size()) {
    Slot v = kNoSlot;
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end());
      const Entry e = heap.back();
      heap.pop_back();
      if (valid(e)) {
        v = ~e.second;
        break;
      }
    }
    if (v == kNoSlot) {
      while (placed[reached[next_seed]]) ++next_seed;
      v = reached[next_seed];
    }
    placed[v] = 1;
    order.push_back(v);
    bump(v, 1);
    window.push_back(v);
    if (window.size() > kWindow) {
      bump(window.front(), -1);
      window.pop_front();
    }
    if (heap.size() > heap_cap) {
      heap.erase(std::remove_if(heap.begin(), heap.end(), [&](const Entry& e) { return !valid(e); }), heap.end());
      std::make_heap(heap.begin(), heap.end());
    }
  }
  return order;
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
    if (method == ReorderMethod::kGorder) order = window_order(order);
  }
  // Free and pending slots (not linked) and anything unreachable keep their relative order.
  for (std::size_t s = 0; s < n; ++s) {
    if (!seen[s]) order.push_back(static_cast<Slot>(s));
  }
  return order;
}

MappedArray<std::uint32_t> HnswIndex::permuted_links0(const SlotPermutation& p) const {
  const std::size_t n = levels_.size();
  if (p.new_to_old.size() != n) throw InvalidArgument("slot permutation size differs from the graph's slots");
  const std::size_t w0 = 1 + m0_;
  const std::uint32_t* old0 = links0_.data();
  MappedArray<std::uint32_t> links0;
  links0.resize(n * w0, 0);
  std::uint32_t* new0 = links0.mutable_data();
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t* src = old0 + static_cast<std::size_t>(p.new_to_old[i]) * w0;
    std::uint32_t* dst = new0 + i * w0;
    dst[0] = src[0];
    for (std::uint32_t j = 1; j <= src[0]; ++j) dst[j] = p.old_to_new[src[j]];
  }
  return links0;
}

void HnswIndex::permute_slots(const SlotPermutation& p, std::optional<MappedArray<std::uint32_t>> links0) {
  const std::size_t n = levels_.size();
  if (p.new_to_old.size() != n) throw InvalidArgument("slot permutation size differs from the graph's slots");
  const std::size_t wu = 1 + params_.M;
  if (!links0 || links0->size() != n * (1 + m0_)) links0 = permuted_links0(p);
  std::vector<std::uint16_t> core0(n);
  std::vector<std::uint8_t> levels(n);
  std::vector<std::unique_ptr<std::uint32_t[]>> upper(n);
  std::vector<std::uint8_t> pending(n);
  for (std::size_t i = 0; i < n; ++i) {
    const Slot o = p.new_to_old[i];
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
  links0_ = std::move(*links0);
  core0_ = std::move(core0);
  levels_ = std::move(levels);
  upper_ = std::move(upper);
  pending_ = std::move(pending);
  for (Slot& s : pending_list_) s = p.old_to_new[s];
  std::sort(pending_list_.begin(), pending_list_.end());
  if (entry_ != kNoSlot) entry_ = p.old_to_new[entry_];
}

std::optional<RowBuffer> VectorStore::permuted_rows(const SlotPermutation& p) const {
  if (!data_.in_place() || p.new_to_old.size() != slot_ids_.size() || slot_ids_.empty()) return std::nullopt;
  return data_.gathered(p.new_to_old, dim_);
}

void VectorStore::permute_slots(const SlotPermutation& p, std::optional<RowBuffer> moved) {
  const std::size_t n = slot_ids_.size();
  if (p.new_to_old.size() != n) throw InvalidArgument("slot permutation size differs from the store's slots");
  if (n == 0) return;
  const bool take_moved = moved && data_.in_place() && moved->size() == n * dim_;
  // Rows read in place from a loaded file are copied out here (or were, into `moved`), before
  // anything moves (so a failed copy changes nothing), and every read and write below goes
  // through the one buffer that is written.
  float* const rows = take_moved ? nullptr : data_.data();
  std::vector<std::int64_t> ids(n);
  std::vector<std::uint8_t> live(n);
  for (std::size_t i = 0; i < n; ++i) {
    ids[i] = slot_ids_[p.new_to_old[i]];
    live[i] = live_[p.new_to_old[i]];
  }
  restore_slots(std::move(ids), std::move(live));
  if (take_moved) {
    data_ = std::move(*moved);
    return;
  }
  // The rows move in place, one cycle of the permutation at a time: no second copy of the
  // rows (1.5 GB at 1M x 384), and rows on disk stay in their file.
  permute_rows_in_place(rows, dim_, p.new_to_old);
}

void MetadataStore::permute_slots(const SlotPermutation& p) {
  const std::size_t n = p.new_to_old.size();
  grow(n);
  for (const auto& f : fields_) {
    std::vector<std::uint8_t> kinds(f->kinds_.size(), 0);
    std::vector<std::int64_t> payload(f->payload_.size(), 0);
    for (std::size_t i = 0; i < n; ++i) {
      kinds[i] = f->kinds_[p.new_to_old[i]];
      payload[i] = f->payload_[p.new_to_old[i]];
    }
    f->kinds_ = std::move(kinds);
    f->payload_ = std::move(payload);
    ++f->version_;  // the sorted indexes and derived data hold slots: stale now
  }
}

void Bm25Index::permute_slots(const SlotPermutation& p) {
  ensure_built();
  const std::size_t n = p.new_to_old.size();
  resize_slots(n);
  std::vector<std::vector<std::pair<std::uint32_t, std::uint32_t>>> doc_terms(doc_terms_.size());
  std::vector<std::uint32_t> doc_len(doc_len_.size(), 0);
  std::vector<std::uint8_t> has(has_.size(), 0);
  for (std::size_t i = 0; i < n; ++i) {
    const Slot o = p.new_to_old[i];
    doc_terms[i] = std::move(doc_terms_[o]);
    doc_len[i] = doc_len_[o];
    has[i] = has_[o];
  }
  doc_terms_ = std::move(doc_terms);
  doc_len_ = std::move(doc_len);
  has_ = std::move(has);
  compact();  // postings rebuilt from doc_terms_, ascending by the new slots; generations reset
  ++version_;
}

void Index::reorder(const std::string& method, std::size_t threads) {
  const ReorderMethod m = parse_reorder_method(method);
  // Everything that only reads the index is made under the shared lock, where searches keep
  // running: the order (gorder: ~10 s at 1M rows), the renumbered level-0 links (a new array
  // either way), and, for rows and codes read in place from a loaded file, the copy their first
  // write would make (1.5 GB of rows at 1M x 384), made in the new order. Rows and codes on
  // the heap move in place under the exclusive lock, without a second copy.
  std::optional<SlotPermutation> prepared;
  std::optional<MappedArray<std::uint32_t>> links0;
  std::optional<RowBuffer> rows;
  std::optional<CodeStore> codes;
  std::uint64_t seen_writes = 0;
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    if (!graph_) throw InvalidArgument("reorder needs an hnsw index: a flat index has no graph to follow");
    std::vector<Slot> order = graph_->locality_order(m);
    seen_writes = writes_;
    if (order.size() == store_.slot_count()) {
      prepared = make_permutation(std::move(order));
      links0 = graph_->permuted_links0(*prepared);
      rows = store_.permuted_rows(*prepared);
      if (codes_trained()) {
        std::visit(
            [&](const auto& c) {
              if (!c.codes_in_place() || c.slot_count() != prepared->new_to_old.size()) return;
              auto moved = c;  // shares the mapped code rows; the move below copies them once
              moved.permute_slots(prepared->new_to_old);
              codes.emplace(std::move(moved));
            },
            *codes_);
      }
    }
  }
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (!graph_) throw InvalidArgument("reorder needs an hnsw index: a flat index has no graph to follow");
  const std::size_t n = store_.slot_count();
  if (!prepared || writes_ != seen_writes) {
    // A writer ran in between (or the graph and the store differed): what was prepared may
    // not fit. Any permutation keeps the answers; the order only decides locality. Slots
    // added since keep their place at the end; if slots were dropped (the store compacted),
    // the order is computed again here.
    std::vector<Slot> order = prepared ? std::move(prepared->new_to_old) : graph_->locality_order(m);
    if (order.size() > n) order = graph_->locality_order(m);
    for (std::size_t s = order.size(); s < n; ++s) order.push_back(static_cast<Slot>(s));
    prepared = make_permutation(std::move(order));
    links0.reset();
    rows.reset();
    codes.reset();
  }
  ++writes_;
  const SlotPermutation& p = *prepared;
  store_.permute_slots(p, std::move(rows));
  graph_->permute_slots(p, std::move(links0));
  meta_.permute_slots(p);
  text_.permute_slots(p);
  if (codes) {
    *codes_ = std::move(*codes);
  } else if (codes_trained()) {
    // Encoding is a function of the row and the trained parameters, so the codes are the
    // rows' codes moved, or, should the code rows not match the slots, encoded again from
    // the moved rows.
    std::visit(
        [&](auto& c) {
          if (c.slot_count() == n) {
            c.permute_slots(p.new_to_old);
          } else {
            std::vector<Slot> live;
            live.reserve(store_.size());
            store_.live_bitmap().for_each([&](Slot s) { live.push_back(s); });
            update_codes_locked(live, threads);
          }
        },
        *codes_);
  }
  store_.release_resident_rows();
}

}  // namespace kbcore
