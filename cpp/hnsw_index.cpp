#include "hnsw_index.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "binary_io.h"
#include "errors.h"
#include "index.h"
#include "parallel.h"

namespace kbcore {

HnswIndex::HnswIndex(const VectorStore& store, Metric metric, HnswParams params)
    : store_(store),
      metric_(metric),
      params_(params),
      m0_(2 * params.M),
      level_mult_(1.0 / std::log(static_cast<double>(std::max<std::size_t>(params.M, 2)))),
      rng_(params.seed) {
  if (params.M < 2 || params.M > kMaxM) {
    throw InvalidArgument("M must be in [2, " + std::to_string(kMaxM) + "], got " + std::to_string(params.M));
  }
  if (params.ef_construction < 1 || params.ef_construction > kMaxEf) {
    throw InvalidArgument("ef_construction must be in [1, 2^30 = " + std::to_string(kMaxEf) + "], got " +
                          std::to_string(params.ef_construction));
  }
  grow();
}

void HnswIndex::grow() {
  // Every mutator passes here (or remove_batch) first: level-0 lists read in place are copied
  // to the heap now, on this thread, before any worker writes one.
  (void)links0_.mutable_data();
  const std::size_t n = store_.slot_count();
  if (levels_.size() >= n) return;
  links0_.resize(n * (1 + m0_), 0);
  core0_.resize(n, 0);
  levels_.resize(n, 0);
  upper_.resize(n);
  pending_.resize(n, 0);
}

void HnswIndex::reset_slot(Slot s, int level) {
  levels_[s] = static_cast<std::uint8_t>(level);
  upper_[s] = level > 0 ? std::make_unique<std::uint32_t[]>(upper_words(s)) : nullptr;  // zeroed
  links0_.mutable_data()[static_cast<std::size_t>(s) * (1 + m0_)] = 0;
  core0_[s] = 0;
}

void HnswIndex::add_pending(const std::vector<Slot>& slots) {
  grow();
  for (Slot s : slots) {
    reset_slot(s);
    if (!pending_[s]) {
      pending_[s] = 1;
      pending_list_.push_back(s);
    }
  }
  std::sort(pending_list_.begin(), pending_list_.end());
}

std::size_t HnswIndex::build_pending(std::size_t max_rows, std::size_t threads) {
  const std::size_t take = std::min(max_rows, pending_list_.size());
  if (take == 0) return pending_list_.size();
  std::vector<Slot> batch(pending_list_.begin(), pending_list_.begin() + static_cast<std::ptrdiff_t>(take));
  pending_list_.erase(pending_list_.begin(), pending_list_.begin() + static_cast<std::ptrdiff_t>(take));
  for (Slot s : batch) pending_[s] = 0;
  insert_batch(batch, threads);
  return pending_list_.size();
}

int HnswIndex::draw_level() {
  // Level ~ floor(-ln(U) * mL) with mL = 1/ln(M) (paper, section 4.1).
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const double r = -std::log(std::max(u(rng_), 1e-300)) * level_mult_;
  return static_cast<int>(std::min<double>(r, kMaxLevel));
}

std::size_t HnswIndex::select_neighbors(std::vector<Scored>& cands, std::size_t m, const Kernels& k) const {
  if (cands.size() <= m) return cands.size();
  std::vector<Scored> kept;
  kept.reserve(m);
  std::uint32_t kept_slots[kMaxLinks];  // m <= capacity(level) <= kMaxLinks
  for (const Scored& c : cands) {
    if (kept.size() >= m) break;
    // Rejected if a kept neighbour is closer to c than the base is.
    if (any_closer(k, store_.vector(c.slot), kept_slots, kept.size(), c.dist)) continue;
    kept_slots[kept.size()] = c.slot;
    kept.push_back(c);
  }
  const std::size_t core = kept.size();
  // Link slots the heuristic left free take the pruned candidates, nearest first.
  if (core < m) {
    std::size_t next = 0;  // kept[0, core) is ascending and a subsequence of cands
    for (const Scored& c : cands) {
      if (kept.size() >= m) break;
      if (next < core && kept[next].slot == c.slot) {
        ++next;
        continue;
      }
      kept.push_back(c);
    }
  }
  cands.swap(kept);
  return core;
}

void HnswIndex::connect_back(Slot n, Slot s, float d, int level, const Kernels& k, bool locked) {
  std::unique_lock<Lock> guard(lock_for(n), std::defer_lock);
  if (locked) guard.lock();
  std::uint32_t* nl = links(n, level);
  const std::size_t cap = capacity(level);
  const std::size_t count = nl[0];
  for (std::size_t j = 0; j < count; ++j) {
    if (nl[1 + j] == s) return;
  }
  const std::size_t core = level == 0 ? std::min<std::size_t>(core0_[n], count) : count;
  const float* nv = store_.vector(n);
  const auto add_to_core = [&] {
    // s joins the core links; fill links (the tail, ascending) move back one place, and the
    // farthest one is dropped when the list is full.
    const std::size_t end = count < cap ? count + 1 : count;
    for (std::size_t j = end; j > core + 1; --j) nl[j] = nl[j - 1];
    nl[1 + core] = s;
    nl[0] = static_cast<std::uint32_t>(end);
    if (level == 0) core0_[n] = static_cast<std::uint16_t>(core + 1);
  };
  if (count < cap) {
    add_to_core();
    return;
  }
  if (level == 0 && core > 0) {
    // Full list [core ascending, fill ascending]. If s is farther than every link, the
    // heuristic would meet it last: it is pruned if a core link is closer to it than n is
    // (then nothing changes), else it is kept as a core link and the farthest fill link
    // goes. Either way the result equals re-running the heuristic, for far fewer distances.
    const std::uint32_t ends[2] = {nl[core], nl[count]};  // the farthest core and fill links
    float de[2];
    score(k, nv, ends, 2, de);
    if (d > de[0] && d > de[1]) {
      if (any_closer(k, store_.vector(s), nl + 1, core, d)) return;  // pruned: nothing changes
      if (core < count) {
        add_to_core();
        return;
      }
    }
  }
  // Full: re-select among the old links plus s with the heuristic, as hnswlib does.
  std::vector<Scored> cands;
  cands.reserve(count + 1);
  cands.push_back({d, s});
  float dn[4 + kMaxLinks];  // count <= cap <= kMaxLinks
  prefetch_rows(nl + 1, count);
  score(k, nv, nl + 1, count, dn);
  for (std::size_t j = 0; j < count; ++j) cands.push_back({dn[j], nl[1 + j]});
  std::sort(cands.begin(), cands.end());
  const std::size_t kept_core = select_neighbors(cands, cap, k);
  nl[0] = static_cast<std::uint32_t>(cands.size());
  for (std::size_t j = 0; j < cands.size(); ++j) nl[1 + j] = cands[j].slot;
  if (level == 0) core0_[n] = static_cast<std::uint16_t>(kept_core);
}

void HnswIndex::link(Slot s, int level, Slot ep, int top, const Kernels& k, bool locked) {
  const float* q = store_.vector(s);
  Scored cur{dist(k, q, ep), ep};
  if (locked) {
    cur = greedy<true>(q, cur, top, level, k);
  } else {
    cur = greedy<false>(q, cur, top, level, k);
  }
  std::vector<Scored> eps{cur};
  for (int l = std::min(level, top); l >= 0; --l) {
    std::vector<Scored> w = locked ? search_layer<true>(q, eps, params_.ef_construction, l, k, AcceptAll{})
                                   : search_layer<false>(q, eps, params_.ef_construction, l, k, AcceptAll{});
    // The node itself can be met when it is being re-linked during repair.
    w.erase(std::remove_if(w.begin(), w.end(), [s](const Scored& x) { return x.slot == s; }), w.end());
    eps = w;
    const std::size_t w_core = select_neighbors(w, params_.M, k);
    {
      // Concurrent inserts may already have linked themselves to s (connect_back): merge
      // those links with the selection instead of overwriting them, or such a node could be
      // left with no incoming link at all.
      std::unique_lock<Lock> guard(lock_for(s), std::defer_lock);
      if (locked) guard.lock();
      std::uint32_t* sl = links(s, l);
      // Order: the selection's core links, links made by others, then its fill links.
      std::vector<Scored> merged(w.begin(), w.begin() + static_cast<std::ptrdiff_t>(w_core));
      for (std::size_t j = 0; j < sl[0]; ++j) {
        const Slot x = sl[1 + j];
        if (std::none_of(w.begin(), w.end(), [x](const Scored& e) { return e.slot == x; })) {
          merged.push_back({dist(k, q, x), x});
        }
      }
      std::size_t core = merged.size();
      merged.insert(merged.end(), w.begin() + static_cast<std::ptrdiff_t>(w_core), w.end());
      if (merged.size() > capacity(l)) {
        if (core < capacity(l)) {
          merged.resize(capacity(l));  // drop the farthest fill links
        } else {
          std::sort(merged.begin(), merged.end());
          core = select_neighbors(merged, capacity(l), k);
        }
      }
      sl[0] = static_cast<std::uint32_t>(merged.size());
      for (std::size_t j = 0; j < merged.size(); ++j) sl[1 + j] = merged[j].slot;
      if (l == 0) core0_[s] = static_cast<std::uint16_t>(std::min(core, merged.size()));
    }
    for (const Scored& n : w) connect_back(n.slot, s, n.dist, l, k, locked);
    if (eps.empty()) eps.push_back(cur);
  }
}

void HnswIndex::insert(Slot s, const Kernels& k) {
  const int level = levels_[s];
  Slot ep;
  int top;
  {
    std::lock_guard<std::mutex> guard(entry_mutex_);
    ep = entry_;
    top = max_level_;
    if (ep == kNoSlot) {
      entry_ = s;
      max_level_ = level;
      return;
    }
  }
  link(s, level, ep, top, k, /*locked=*/true);
  if (level > top) {
    std::lock_guard<std::mutex> guard(entry_mutex_);
    if (level > max_level_) {
      entry_ = s;
      max_level_ = level;
    }
  }
}

void HnswIndex::insert_batch(const std::vector<Slot>& slots, std::size_t threads) {
  grow();
  for (Slot s : slots) reset_slot(s, draw_level());
  const Kernels& k = active_kernels();
  std::size_t start = 0;
  // The first node must become the entry point before workers start from it.
  if (entry_ == kNoSlot && !slots.empty()) {
    insert(slots[0], k);
    start = 1;
  }
  const std::size_t workers = resolve_threads(threads, slots.size() - start);
  parallel_for(
      slots.size() - start, workers, [&](std::size_t i, std::size_t) { insert(slots[start + i], k); }, 16);
  if (workers > 1) ensure_reachable(k);
}

void HnswIndex::ensure_reachable(const Kernels& k, const std::vector<std::uint8_t>* dead) {
  if (entry_ == kNoSlot) return;
  const std::size_t n = levels_.size();
  // Level 0 must let a search reach every live node from the entry point. Concurrent
  // inserts and heavy deletion can leave a node with no incoming link; such nodes are
  // re-linked by search (which gives them incoming links from reachable nodes). A few rounds
  // settle it; a node the heuristic still refuses is appended to its nearest reachable
  // neighbour's list directly.
  for (int round = 0; round < 4; ++round) {
    std::vector<std::uint8_t> seen(n, 0);
    std::vector<Slot> stack;
    // Marks everything reachable from `from` (itself included).
    const auto reach = [&](Slot from) {
      seen[from] = 1;
      stack.push_back(from);
      while (!stack.empty()) {
        const Slot c = stack.back();
        stack.pop_back();
        const std::uint32_t* cl = links(c, 0);
        for (std::size_t j = 0; j < cl[0]; ++j) {
          if (!seen[cl[1 + j]]) {
            seen[cl[1 + j]] = 1;
            stack.push_back(cl[1 + j]);
          }
        }
      }
    };
    reach(entry_);
    std::vector<Slot> lost;
    for (std::size_t s = 0; s < n; ++s) {
      if (store_.is_live(static_cast<Slot>(s)) && !seen[s] && !pending_[s] && !(dead && (*dead)[s])) {
        lost.push_back(static_cast<Slot>(s));
      }
    }
    if (lost.empty()) return;
    for (Slot s : lost) {
      if (round < 3) {
        link(s, levels_[s], entry_, max_level_, k, /*locked=*/false);
        continue;
      }
      // Last resort: make the nearest reachable node point at s. A node linked earlier in
      // this loop made its own neighbours reachable too (reach() below): s may be one of them,
      // and appending it again would repeat a link in one list (which load() refuses). Lost
      // nodes often link to each other (identical vectors: all of a cluster of duplicates).
      if (seen[s]) continue;
      Scored best{std::numeric_limits<float>::infinity(), kNoSlot};
      for (std::size_t t = 0; t < n; ++t) {
        if (!seen[t]) continue;
        const float d = dist(k, store_.vector(s), static_cast<Slot>(t));
        if (d < best.dist) best = {d, static_cast<Slot>(t)};
      }
      if (best.slot == kNoSlot) continue;
      std::uint32_t* bl = links(best.slot, 0);
      // best is reachable and s is not, so best's list does not hold s yet.
      if (bl[0] < m0_) {
        bl[1 + bl[0]] = s;
        ++bl[0];
      } else {
        bl[bl[0]] = s;  // replaces its last (least recently selected) link
      }
      reach(s);
    }
  }
}

void HnswIndex::pick_new_entry(const std::vector<std::uint8_t>& dead) {
  entry_ = kNoSlot;
  max_level_ = -1;
  for (std::size_t s = 0; s < levels_.size(); ++s) {
    if (!store_.is_live(static_cast<Slot>(s)) || dead[s] || pending_[s]) continue;
    if (static_cast<int>(levels_[s]) > max_level_) {
      max_level_ = levels_[s];
      entry_ = static_cast<Slot>(s);
    }
  }
}

void HnswIndex::remove_batch(const std::vector<Slot>& slots, std::size_t threads) {
  if (slots.empty()) return;
  (void)links0_.mutable_data();  // lists read in place copied before the workers (as grow)
  const std::size_t n = levels_.size();
  std::vector<std::uint8_t> dead(n, 0);
  bool pending_removed = false;
  for (Slot s : slots) {
    dead[s] = 1;
    if (pending_[s]) {
      pending_[s] = 0;
      pending_removed = true;
    }
  }
  if (pending_removed) {
    pending_list_.erase(
        std::remove_if(pending_list_.begin(), pending_list_.end(), [&](Slot s) { return dead[s] != 0; }),
        pending_list_.end());
  }
  const Kernels& k = active_kernels();
  if (entry_ != kNoSlot && dead[entry_]) pick_new_entry(dead);

  // Nodes that point at a removed node, per level, are repaired from their surviving links
  // plus the surviving links of the removed neighbours. Each repair reads only its own list
  // and lists of removed nodes (which nothing writes), so repairs run in parallel unlocked.
  std::vector<Slot> live;
  live.reserve(store_.size());
  for (std::size_t s = 0; s < n; ++s) {
    if (store_.is_live(static_cast<Slot>(s)) && !dead[s]) live.push_back(static_cast<Slot>(s));
  }
  std::vector<std::uint8_t> orphan(n, 0);
  parallel_for(
      live.size(), threads,
      [&](std::size_t i, std::size_t) {
        const Slot p = live[i];
        const float* pv = store_.vector(p);
        for (int l = 0; l <= levels_[p]; ++l) {
          std::uint32_t* pl = links(p, l);
          bool touched = false;
          for (std::size_t j = 0; j < pl[0]; ++j) touched |= dead[pl[1 + j]] != 0;
          if (!touched) continue;
          std::vector<Slot> pool;
          for (std::size_t j = 0; j < pl[0]; ++j) {
            const Slot x = pl[1 + j];
            if (!dead[x]) {
              pool.push_back(x);
              continue;
            }
            const std::uint32_t* xl = links(x, l);
            for (std::size_t t = 0; t < xl[0]; ++t) {
              const Slot y = xl[1 + t];
              if (y != p && !dead[y]) pool.push_back(y);
            }
          }
          std::sort(pool.begin(), pool.end());
          pool.erase(std::unique(pool.begin(), pool.end()), pool.end());
          std::vector<Scored> cands;
          cands.reserve(pool.size());
          for (Slot y : pool) cands.push_back({distance(k, metric_, pv, store_.vector(y), store_.dim()), y});
          std::sort(cands.begin(), cands.end());
          const std::size_t core = select_neighbors(cands, capacity(l), k);
          pl[0] = static_cast<std::uint32_t>(cands.size());
          for (std::size_t j = 0; j < cands.size(); ++j) pl[1 + j] = cands[j].slot;
          if (l == 0) core0_[p] = static_cast<std::uint16_t>(core);
          if (l == 0 && cands.empty()) orphan[p] = 1;
        }
      },
      64);

  for (Slot s : slots) reset_slot(s);
  // A node whose every neighbour (and their neighbours) was removed is re-linked by search.
  for (std::size_t s = 0; s < n; ++s) {
    if (!orphan[s] || static_cast<Slot>(s) == entry_ || entry_ == kNoSlot) continue;
    link(static_cast<Slot>(s), levels_[s], entry_, max_level_, k, /*locked=*/false);
  }
  ensure_reachable(k, &dead);
}

std::size_t HnswIndex::memory_bytes() const {
  std::size_t bytes = links0_.heap_bytes() + core0_.capacity() * sizeof(std::uint16_t) + levels_.capacity() +
                      upper_.capacity() * sizeof(upper_[0]);
  for (std::size_t s = 0; s < levels_.size(); ++s) bytes += upper_words(static_cast<Slot>(s)) * sizeof(std::uint32_t);
  return bytes;
}

const char* HnswIndex::check_graph(const VectorStore& store, std::size_t m, std::size_t m0,
                                   const std::vector<std::uint8_t>& levels, const std::uint32_t* links0,
                                   const std::vector<std::unique_ptr<std::uint32_t[]>>& upper,
                                   const std::vector<std::uint8_t>& pending, Slot entry, int max_level) {
  const std::size_t n = levels.size();
  if (n != store.slot_count() || pending.size() != n || upper.size() != n) return "graph and store disagree on slots";
  int seen_max = -1;
  std::size_t graph_nodes = 0;
  for (std::size_t s = 0; s < n; ++s) {
    const auto slot = static_cast<Slot>(s);
    if (levels[s] > kMaxLevel) return "node level out of range";
    if (!store.is_live(slot)) {
      if (levels[s] != 0 || links0[s * (1 + m0)] != 0) return "free slot has links";
      continue;
    }
    if (levels[s] > 0 && !upper[s]) return "node without its upper-level lists";
  }
  for (std::size_t s = 0; s < n; ++s) {
    const auto slot = static_cast<Slot>(s);
    if (pending[s] > 1) return "invalid pending flag";
    if (pending[s]) {
      if (!store.is_live(slot) || levels[s] != 0 || links0[s * (1 + m0)] != 0) {
        return "a pending node must be live and unlinked";
      }
      continue;
    }
    if (!store.is_live(slot)) continue;
    ++graph_nodes;
    seen_max = std::max(seen_max, static_cast<int>(levels[s]));
  }
  // Every link must name a linked live slot that has a list at that level, other than the
  // node itself and at most once per list, and every count must fit its list: a crafted file
  // must not make a search read out of bounds (an upper-level link to a node without that
  // level would be a null list) nor leave a graph that a later insert or removal trips on.
  // The nodes are checked a block at a time on the hardware's threads (from 64K slots), each
  // worker with its own stamps; the defect reported is the one of the first bad block, as a
  // serial pass would report it.
  constexpr std::size_t kBlockSlots = 4096;
  const std::size_t blocks = (n + kBlockSlots - 1) / kBlockSlots;
  const std::size_t threads = resolve_threads(n >= 16 * kBlockSlots ? 0 : 1, blocks);
  std::vector<std::vector<std::uint64_t>> stamps(threads);  // list number + 1 of the list that last named a slot
  std::vector<std::uint64_t> list_nos(threads, 0);
  std::vector<const char*> defects(blocks, nullptr);
  parallel_for(blocks, threads, [&](std::size_t b, std::size_t w) {
    std::vector<std::uint64_t>& stamp = stamps[w];
    if (stamp.empty()) stamp.assign(n, 0);
    std::uint64_t& list_no = list_nos[w];
    const auto check = [&](Slot s, const std::uint32_t* l, std::size_t cap, int level) -> const char* {
      if (l[0] > cap) return "link count exceeds capacity";
      ++list_no;
      for (std::size_t j = 0; j < l[0]; ++j) {
        const std::uint32_t t = l[1 + j];
        if (t >= n || !store.is_live(t) || pending[t]) return "link to a missing node";
        if (levels[t] < level) return "link to a node without that level";
        if (t == s) return "node links to itself";
        if (stamp[t] == list_no) return "repeated link in one list";
        stamp[t] = list_no;
      }
      return nullptr;
    };
    for (std::size_t s = b * kBlockSlots; s < std::min(n, (b + 1) * kBlockSlots); ++s) {
      if (!store.is_live(static_cast<Slot>(s)) || pending[s]) continue;
      const auto slot = static_cast<Slot>(s);
      if ((defects[b] = check(slot, &links0[s * (1 + m0)], m0, 0)) != nullptr) return;
      for (int l = 1; l <= levels[s]; ++l) {
        if ((defects[b] = check(slot, &upper[s][static_cast<std::size_t>(l - 1) * (1 + m)], m, l)) != nullptr) return;
      }
    }
  });
  for (const char* why : defects) {
    if (why != nullptr) return why;
  }
  if (graph_nodes == 0) {
    if (entry != kNoSlot || max_level != -1) return "empty graph with an entry point";
  } else if (entry >= n || !store.is_live(entry) || pending[entry] || levels[entry] != max_level ||
             max_level != seen_max) {
    return "invalid entry point";
  }
  return nullptr;
}

void HnswIndex::save(BinaryWriter& w) const {
  // What load() would refuse is never written: the caller's previous file stays in place.
  if (const char* why =
          check_graph(store_, params_.M, m0_, levels_, links0_.data(), upper_, pending_, entry_, max_level_)) {
    throw FormatError(std::string("refusing to save an index graph that load would reject: ") + why);
  }
  w.u64(params_.M);
  w.u64(params_.ef_construction);
  w.u64(params_.seed);
  w.u32(entry_);
  w.u32(static_cast<std::uint32_t>(max_level_ + 1));
  w.u64(levels_.size());
  w.array(levels_.data(), levels_.size());
  if (w.version() >= Index::kFormatVersionAligned) w.pad_to(kLinksAlign);
  w.array(links0_.data(), links0_.size());
  for (std::size_t s = 0; s < levels_.size(); ++s) {
    if (levels_[s] > 0) w.array(upper_[s].get(), upper_words(static_cast<Slot>(s)));
  }
  w.array(pending_.data(), pending_.size());
}

void HnswIndex::load(BinaryReader& r) {
  const std::size_t n = store_.slot_count();
  const std::uint64_t m = r.u64();
  const std::uint64_t efc = r.u64();
  const std::uint64_t seed = r.u64();
  if (m != params_.M || efc != params_.ef_construction) r.fail("graph parameters disagree with the header");
  const Slot entry = r.u32();
  const std::uint32_t levels_stored = r.u32();  // max_level + 1
  if (levels_stored > kMaxLevel + 1) r.fail("graph level count out of range");
  const int max_level = static_cast<int>(levels_stored) - 1;
  const std::uint64_t slots = r.u64();
  if (slots != n) r.fail("graph covers " + std::to_string(slots) + " slots, store has " + std::to_string(n));
  std::vector<std::uint8_t> levels;
  r.array(levels, n);
  // Version 7 aligns the level-0 lists to a 64-byte file offset: from a mapped file (on a
  // little-endian host) they are read in place, checked below like a copy, and the first write
  // copies them to the heap: a reopen neither copies them nor has the kernel zero a copy's pages.
  if (r.version() >= Index::kFormatVersionAligned) r.skip_padding(kLinksAlign);
  const std::size_t words = n * (1 + m0_);
  r.require(words, sizeof(std::uint32_t));
  MappedArray<std::uint32_t> links0;
  if (r.bytes()->mapped() && host_little_endian() && reinterpret_cast<std::uintptr_t>(r.here()) % kLinksAlign == 0) {
    links0.use_mapped(r.bytes(), reinterpret_cast<const std::uint32_t*>(r.here()), words);
    r.skip(words, sizeof(std::uint32_t));
  } else {
    AlignedVector<std::uint32_t> copy;  // huge-page backed when large (aligned.h)
    r.array(copy, words);
    links0.resize(words);
    if (words != 0) std::memcpy(links0.mutable_data(), copy.data(), words * sizeof(std::uint32_t));
  }
  std::vector<std::unique_ptr<std::uint32_t[]>> upper(n);
  for (std::size_t s = 0; s < n; ++s) {
    if (levels[s] > kMaxLevel) r.fail("node level out of range");
    if (!store_.is_live(static_cast<Slot>(s))) {
      if (levels[s] != 0 || links0.data()[s * (1 + m0_)] != 0) r.fail("free slot has links");
      continue;
    }
    if (levels[s] > 0) {
      const std::size_t words = static_cast<std::size_t>(levels[s]) * (1 + m);
      r.require(words, sizeof(std::uint32_t));  // before allocating
      upper[s] = std::make_unique<std::uint32_t[]>(words);
      r.array_into(upper[s].get(), words);
    }
  }
  std::vector<std::uint8_t> pending;
  r.array(pending, n);
  if (const char* why = check_graph(store_, m, m0_, levels, links0.data(), upper, pending, entry, max_level)) {
    r.fail(why);
  }
  std::vector<Slot> pending_list;
  for (std::size_t s = 0; s < n; ++s) {
    if (pending[s]) pending_list.push_back(static_cast<Slot>(s));
  }
  pending_ = std::move(pending);
  pending_list_ = std::move(pending_list);
  params_.seed = seed;
  levels_ = std::move(levels);
  links0_ = std::move(links0);
  // Persisted lists do not record which links are fill links: all count as core links.
  core0_.assign(n, 0);
  for (std::size_t s = 0; s < n; ++s) core0_[s] = static_cast<std::uint16_t>(links0_.data()[s * (1 + m0_)]);
  upper_ = std::move(upper);
  entry_ = entry;
  max_level_ = max_level;
  rng_.seed(seed ^ n);
}

}  // namespace kbcore
