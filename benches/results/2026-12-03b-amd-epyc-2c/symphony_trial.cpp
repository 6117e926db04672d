// Trial of the SymphonyQG / NGT-QG layout (issue 13): each node's level-0 block holds its link
// list and, next to it, the code rows of its neighbours, so that expanding a node reads one
// contiguous block instead of one scattered code row per unvisited neighbour. An experiment, not
// product code: it reaches into kbcore's internals (the private members of a loaded Index) and
// is built by hand against the static core library:
//
//   cmake -S . -B /tmp/sym -G Ninja -DCMAKE_BUILD_TYPE=Release -DKBCORE_BUILD_PYTHON=OFF
//   ninja -C /tmp/sym kbcore_core
//   g++ -std=c++17 -O3 -Icpp benches/results/2026-12-03b-amd-epyc-2c/symphony_trial.cpp \
//     /tmp/sym/libkbcore_core.a -lpthread -o /tmp/sym/trial
//   /tmp/sym/trial INDEX QUERIES.f32 GT.i64 k   (written by symphony_trial.py)
//
// Both searches run the same traversal (HnswCodeSearch::descend on the scattered codes, then
// the level-0 walk with the same candidate list, the same kernels and the same re-rank), and
// differ only in where the level-0 walk reads a neighbour's code row: its slot's row in the
// code array (kbcore's layout), or its place in the expanded node's block (the trial layout).
// Passes alternate between the two layouts, five per ef.
#define private public
#define protected public
#include "hnsw_codes.h"
#include "index.h"
#undef private
#undef protected

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

using namespace kbcore;

namespace {

template <typename T>
std::vector<T> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  const auto n = static_cast<std::size_t>(f.tellg());
  std::vector<T> v(n / sizeof(T));
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n));
  return v;
}

// Per node: [count, m0 ids] padded to a cache line, then m0 code rows (the neighbours' rows in
// link order; unused places zero).
struct Blocks {
  std::size_t head = 0, stride = 0, bytes = 0;
  AlignedVector<std::uint8_t> data;
  const std::uint8_t* block(Slot s) const { return data.data() + static_cast<std::size_t>(s) * bytes; }
};

template <typename Codes>
Blocks make_blocks(const HnswIndex& g, const Codes& codes) {
  Blocks b;
  b.head = (4 * (1 + g.m0_) + 63) / 64 * 64;
  b.stride = codes.stride();
  b.bytes = b.head + g.m0_ * b.stride;
  const std::size_t n = g.levels_.size();
  b.data.assign(n * b.bytes, 0);
  for (Slot s = 0; s < n; ++s) {
    std::uint8_t* p = b.data.data() + static_cast<std::size_t>(s) * b.bytes;
    const std::uint32_t* l = g.links(s, 0);
    std::memcpy(p, l, 4 * (1 + l[0]));
    for (std::uint32_t j = 0; j < l[0]; ++j) std::memcpy(p + b.head + j * b.stride, codes.code(l[1 + j]), b.stride);
  }
  return b;
}

// Distance of a code row (not a slot) to a prepared query: the same arithmetic as the Codes'
// distance4 (RaBitQ: estimate; SQ8: c0 + c1 dot + c2 term, term 0 under cosine).
void dist4_rows(const RabitqCodes& c, const RabitqKernels& k, const RabitqQuery& q, const std::uint8_t* const* rows,
                float* out) {
  std::int32_t dots[4];
  k.dot4(q.qi.data(), rows, c.padded_, dots);
  for (int j = 0; j < 4; ++j) {  // RabitqCodes::estimate (inline in rabitq_codes.cpp)
    float f[2];
    std::memcpy(f, rows[j] + c.code_bytes_, sizeof(f));
    const float d = q.c0 + f[0] * (q.c1 * static_cast<float>(dots[j]) + q.c2);
    out[j] = c.metric_ == Metric::kL2 ? d + f[1] : d;
  }
}
void dist4_rows(const Sq8Codes& c, const Sq8Kernels& k, const Sq8Query& q, const std::uint8_t* const* rows,
                float* out) {
  std::int32_t dots[4];
  if (k.dot4_i8 != nullptr) {
    k.dot4_i8(q.q8.data(), rows, c.stride(), dots);
  } else {
    k.dot4(q.qi.data(), rows, c.stride(), dots);
  }
  for (int j = 0; j < 4; ++j) out[j] = q.c0 + q.c1 * static_cast<float>(dots[j]);
}

// HnswCodeSearch::layer0 with the rows read from the expanded node's block.
template <typename Codes, typename Kernels, typename Query>
std::vector<Scored> layer0_blocks(const HnswIndex& g, const Blocks& b, const Codes& codes, const Kernels& kern,
                                  const Query& pq, Scored ep, std::size_t ef, VisitedSet& visited_set) {
  const VisitedSet::View visited = visited_set.view();
  std::vector<Scored>& candidates = search_scratch().sq8_candidates;
  candidates.clear();
  std::vector<Scored> results;
  results.reserve(ef);
  visited.test_and_set(ep.slot);
  candidates.push_back(ep);
  results.push_back(ep);
  std::uint32_t fresh[4 + kMaxLinks];
  const std::uint8_t* rows[4 + kMaxLinks];
  float dists[4 + kMaxLinks];
  while (!candidates.empty()) {
    const Scored c = candidates.front();
    if (results.size() >= ef && c.dist > results.front().dist) break;
    std::pop_heap(candidates.begin(), candidates.end(), detail::ScoredGreater{});
    candidates.pop_back();
    if (!candidates.empty()) prefetch_block_l1(b.block(candidates.front().slot), b.head);
    const std::uint8_t* blk = b.block(c.slot);
    const auto* ids = reinterpret_cast<const std::uint32_t*>(blk);
    const std::size_t count = ids[0];
    std::size_t m = 0;
    for (std::size_t j = 0; j < count; ++j) {
      const Slot n = ids[1 + j];
      if (visited.test_and_set(n)) continue;
      rows[m] = blk + b.head + j * b.stride;
      prefetch_row_l2(rows[m], b.stride);
      fresh[m++] = n;
    }
    std::size_t j = 0;
    for (; j < m; j += 4) {
      for (std::size_t t = m; t < j + 4; ++t) rows[t] = rows[m - 1];  // pad the last block
      dist4_rows(codes, kern, pq, rows + j, dists + j);
    }
    for (j = 0; j < m; ++j) {
      const float d = dists[j];
      if (results.size() < ef || d < results.front().dist) {
        candidates.push_back({d, fresh[j]});
        std::push_heap(candidates.begin(), candidates.end(), detail::ScoredGreater{});
        prefetch_l1(b.block(fresh[j]));
        results.push_back({d, fresh[j]});
        std::push_heap(results.begin(), results.end());
        if (results.size() > ef) {
          std::pop_heap(results.begin(), results.end());
          results.pop_back();
        }
      }
    }
  }
  return results;
}

template <typename Codes>
std::vector<Scored> search_blocks(const HnswIndex& g, const Blocks& b, const Codes& codes, const float* q,
                                  std::size_t k, std::size_t ef, std::size_t rerank) {
  const auto& kern = CodeTraits<Codes>::kernels(codes);
  auto& pq = CodeTraits<Codes>::query(search_scratch());
  codes.prepare(q, pq);
  auto visited = g.visited_.acquire(g.levels_.size());
  const Scored cur = HnswCodeSearch::descend(g, codes, kern, pq, *visited);
  visited->reset(g.levels_.size());
  const std::size_t depth = std::max(rerank, k);
  std::vector<Scored> res = layer0_blocks(g, b, codes, kern, pq, cur, std::max({ef, k, depth}), *visited);
  if constexpr (CodeTraits<Codes>::kBounded) {
    return rerank_bounded(g.store_, codes, pq, g.metric_, q, std::move(res), depth, k);
  } else {
    return rerank_exact(g.store_, g.metric_, q, std::move(res), depth, k);
  }
}

template <typename Codes>
int run(const Index& idx, const Codes& codes, const std::vector<float>& queries, const std::vector<std::int64_t>& gt,
        std::size_t gt_k, std::size_t k) {
  const HnswIndex& g = *idx.graph_;
  const std::size_t dim = idx.dim(), nq = queries.size() / dim;
  auto t0 = std::chrono::steady_clock::now();
  const Blocks b = make_blocks(g, codes);
  const double build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("blocks: %zu B per node (%zu B head + %zu x %zu B rows), %.1f MB, made in %.2f s; code array %.1f MB\n",
              b.bytes, b.head, g.m0_, b.stride, b.data.size() / 1e6, build_s,
              static_cast<double>(g.levels_.size() * codes.stride()) / 1e6);
  // Queries normalised for cosine (what Index::prepare_queries does).
  std::vector<float> qs(queries);
  if (idx.config().metric == Metric::kCosine) {
    for (std::size_t i = 0; i < nq; ++i) {
      float s = 0;
      for (std::size_t d = 0; d < dim; ++d) s += qs[i * dim + d] * qs[i * dim + d];
      s = 1.0f / std::sqrt(s);
      for (std::size_t d = 0; d < dim; ++d) qs[i * dim + d] *= s;
    }
  }
  const auto recall = [&](const std::vector<std::vector<Scored>>& res) {
    std::size_t hit = 0;
    for (std::size_t i = 0; i < nq; ++i) {
      std::set<std::int64_t> want(gt.begin() + static_cast<std::ptrdiff_t>(i * gt_k),
                                  gt.begin() + static_cast<std::ptrdiff_t>(i * gt_k + k));
      for (const Scored& s : res[i]) hit += want.count(idx.store_.id_of(s.slot));
    }
    return static_cast<double>(hit) / static_cast<double>(nq * k);
  };
  std::printf("%5s %10s %10s %12s %12s %8s\n", "ef", "recall", "recall", "QPS kbcore", "QPS blocks", "blocks/");
  for (std::size_t ef : {10, 16, 24, 32, 48, 64, 96, 128}) {
    const std::size_t rerank = idx.rerank_depth(ef, k);
    std::vector<std::vector<Scored>> ra(nq), rb(nq);
    std::vector<double> ta, tb;
    for (int pass = 0; pass < 6; ++pass) {  // pass 0 warms up (and gives the recall)
      for (int layout = 0; layout < 2; ++layout) {
        const bool blocks = (layout + pass) % 2 == 1;
        const auto s = std::chrono::steady_clock::now();
        for (std::size_t i = 0; i < nq; ++i) {
          const float* q = qs.data() + i * dim;
          auto r = blocks ? search_blocks(g, b, codes, q, k, ef, rerank)
                          : HnswCodeSearch::search(g, codes, q, k, ef, rerank, AcceptAll{});
          (blocks ? rb : ra)[i] = std::move(r);
        }
        const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
        if (pass > 0) (blocks ? tb : ta).push_back(t);
      }
    }
    std::vector<double> ratio;
    for (std::size_t p = 0; p < ta.size(); ++p) ratio.push_back(ta[p] / tb[p]);
    const auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    std::printf("%5zu %10.4f %10.4f %12.0f %12.0f %5.2f (%.2f-%.2f)\n", ef, recall(ra), recall(rb), nq / median(ta),
                nq / median(tb), median(ratio), *std::min_element(ratio.begin(), ratio.end()),
                *std::max_element(ratio.begin(), ratio.end()));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s INDEX QUERIES.f32 GT.i64 k\n", argv[0]);
    return 2;
  }
  const auto idx = Index::load(argv[1]);
  const auto queries = read_all<float>(argv[2]);
  const auto gt = read_all<std::int64_t>(argv[3]);
  const std::size_t k = std::stoul(argv[4]);
  const std::size_t nq = queries.size() / idx->dim(), gt_k = gt.size() / nq;
  std::printf("%s: %zu rows, %zu queries, k %zu\n", argv[1], idx->store_.size(), nq, k);
  if (idx->rabitq_) return run(*idx, *idx->rabitq_, queries, gt, gt_k, k);
  if (idx->codes_) return run(*idx, *idx->codes_, queries, gt, gt_k, k);
  std::fprintf(stderr, "not a quantized index\n");
  return 2;
}
