// Trial of SymphonyQG's FastScan neighbour scoring on kbcore's graph (issue 28, part B). An
// experiment, not product code: it reaches into kbcore's internals (the private members of a
// loaded Index) and is built by hand against the static core library:
//
//   cmake -S . -B build/ctest -DKBCORE_BUILD_PYTHON=OFF -DKBCORE_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Release
//   cmake --build build/ctest --target kbcore_core
//   g++ -std=c++17 -O3 -DKBCORE_HAVE_X86_KERNELS=1 -Icpp \
//     benches/trials/fastscan_trial.cpp build/ctest/libkbcore_core.a \
//     -lpthread -o build/fastscan_trial
//   build/fastscan_trial DIR   (DIR written by benches/trials/fastscan_trial.py)
//
// The FastScan variant: each node's level-0 block holds its (up to 32) neighbours' 1-bit RaBitQ
// codes, packed four dimensions to a nibble and 32 neighbours to 16 bytes per group of four
// dimensions (byte j: neighbour j in the low nibble, neighbour j + 16 in the high one), then the
// neighbours' F_x. A query builds one 16-entry LUT per group (the sum of its int16 rotated
// query over the set bits), requantized to uint8 with one scale; expanding a node scores all
// of its neighbours at once with two vpshufb per pair of groups (AVX2), the estimate
//   1 - <x, q> ~= c0 + F_x (c1 dot + c2),  dot ~= acc / scale + sum of the groups' minima,
// and the walk's candidates (the list of kbcore's RaBitQ search, max(ef, 2k)) go through
// kbcore's bounded exact re-rank, as in kbcore's own RaBitQ search. The descent is kbcore's on
// the codes. Compared, interleaved in one process over an ef grid (thread CPU time): kbcore's
// sq8 search, kbcore's RaBitQ 1-bit search, the FastScan walk on the same 1-bit index, and the
// SymphonyQG-ordered walk (search_qg) on blocks that also hold each node's float32 row.
#define private public
#define protected public
#include "graph_search.h"
#include "hnsw_codes.h"
#include "index.h"
#include "search_scratch.h"
#include "vector_checks.h"
#undef private
#undef protected

#include <immintrin.h>
#include <time.h>

#include <algorithm>
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

double cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

constexpr std::size_t kNb = 32;  // neighbours per block (M = 16: m0 = 32)
// How much of the next candidate's block to prefetch (-DPREFETCH=..., bytes; the rest streams).
#ifndef PREFETCH
#define PREFETCH 1 << 20
#endif
constexpr std::size_t kPrefetchBytes = PREFETCH;

struct FsBlocks {
  std::size_t groups = 0;  // padded_dim / 4
  std::size_t bytes = 0;   // groups * 16 code bytes, then kNb floats F_x; a multiple of 64
  std::vector<std::uint8_t> data;
  const std::uint8_t* block(Slot s) const { return data.data() + static_cast<std::size_t>(s) * bytes; }
};

FsBlocks make_blocks(const HnswIndex& g, const RabitqCodes& codes) {
  FsBlocks b;
  b.groups = codes.padded_ / 4;
  b.bytes = (b.groups * 16 + kNb * sizeof(float) + 63) / 64 * 64;
  const std::size_t n = g.levels_.size();
  b.data.assign(n * b.bytes + 64, 0);
  for (Slot s = 0; s < n; ++s) {
    std::uint8_t* p = b.data.data() + static_cast<std::size_t>(s) * b.bytes;
    const std::uint32_t* l = g.links(s, 0);
    for (std::uint32_t j = 0; j < l[0]; ++j) {
      const std::uint8_t* row = codes.code(l[1 + j]);
      for (std::size_t grp = 0; grp < b.groups; ++grp) {
        const unsigned nib = (row[grp / 2] >> (4 * (grp % 2))) & 15u;  // dims 4 grp .. 4 grp + 3
        p[grp * 16 + j % 16] = static_cast<std::uint8_t>(p[grp * 16 + j % 16] | (nib << (j < 16 ? 0 : 4)));
      }
      float f = 0;
      std::memcpy(&f, row + codes.code_bytes_, sizeof(f));
      std::memcpy(p + b.groups * 16 + j * sizeof(float), &f, sizeof(f));
    }
  }
  return b;
}

struct Luts {
  std::vector<std::uint8_t> lut;  // groups * 16
  float inv_scale = 0;
  float sum_min = 0;
};

void make_luts(const RabitqQuery& pq, std::size_t groups, Luts& out) {
  out.lut.resize(groups * 16);
  thread_local std::vector<std::int32_t> vals;
  vals.resize(groups * 16);
  std::int64_t sum_min = 0;
  std::int32_t range = 1;
  for (std::size_t grp = 0; grp < groups; ++grp) {
    std::int32_t* v = vals.data() + grp * 16;
    const std::int16_t* x = pq.qi.data() + 4 * grp;
    v[0] = 0;
    for (unsigned m = 1; m < 16; ++m) v[m] = v[m & (m - 1)] + x[__builtin_ctz(m)];  // add the lowest set bit
    // The minimum is the sum of the negative entries; shift the group to start at 0.
    std::int32_t lo = 0;
    for (unsigned bit = 0; bit < 4; ++bit) lo += std::min<std::int32_t>(0, x[bit]);
    for (unsigned m = 0; m < 16; ++m) v[m] -= lo;
    sum_min += lo;
    std::int32_t hi = 0;
    for (unsigned m = 0; m < 16; ++m) hi = std::max(hi, v[m]);
    range = std::max(range, hi);
  }
  const float scale = 255.0f / static_cast<float>(range);
  for (std::size_t i = 0; i < vals.size(); ++i) {
    out.lut[i] = static_cast<std::uint8_t>(static_cast<float>(vals[i]) * scale + 0.5f);  // >= 0: rounds
  }
  out.inv_scale = 1.0f / scale;
  out.sum_min = static_cast<float>(sum_min);
}

__attribute__((target("avx2"))) void fastscan_avx2(const std::uint8_t* codes, const std::uint8_t* lut,
                                                   std::size_t groups, std::uint32_t* acc) {
  const __m256i mask = _mm256_set1_epi8(0x0f);
  const __m256i low_bytes = _mm256_set1_epi16(0x00ff);
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (std::size_t grp = 0; grp < groups; grp += 2) {
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + grp * 16));
    const __m256i t = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lut + grp * 16));
    const __m256i lo = _mm256_and_si256(c, mask);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(c, 4), mask);
    const __m256i rl = _mm256_shuffle_epi8(t, lo);
    const __m256i rh = _mm256_shuffle_epi8(t, hi);
    a0 = _mm256_add_epi16(a0, _mm256_and_si256(rl, low_bytes));
    a1 = _mm256_add_epi16(a1, _mm256_srli_epi16(rl, 8));
    a2 = _mm256_add_epi16(a2, _mm256_and_si256(rh, low_bytes));
    a3 = _mm256_add_epi16(a3, _mm256_srli_epi16(rh, 8));
  }
  alignas(32) std::uint16_t s[4][16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(s[0]), a0);
  _mm256_store_si256(reinterpret_cast<__m256i*>(s[1]), a1);
  _mm256_store_si256(reinterpret_cast<__m256i*>(s[2]), a2);
  _mm256_store_si256(reinterpret_cast<__m256i*>(s[3]), a3);
  for (std::size_t j = 0; j < 16; ++j) {
    const std::size_t which = j % 2;  // even bytes in a0 / a2, odd in a1 / a3
    acc[j] = static_cast<std::uint32_t>(s[which][j / 2]) + s[which][8 + j / 2];
    acc[16 + j] = static_cast<std::uint32_t>(s[2 + which][j / 2]) + s[2 + which][8 + j / 2];
  }
}

void fastscan_scalar(const std::uint8_t* codes, const std::uint8_t* lut, std::size_t groups, std::uint32_t* acc) {
  for (std::size_t j = 0; j < kNb; ++j) acc[j] = 0;
  for (std::size_t grp = 0; grp < groups; ++grp) {
    for (std::size_t j = 0; j < 16; ++j) {
      const std::uint8_t c = codes[grp * 16 + j];
      acc[j] += lut[grp * 16 + (c & 15u)];
      acc[16 + j] += lut[grp * 16 + (c >> 4)];
    }
  }
}

std::vector<Scored> walk_fs(const HnswIndex& g, const FsBlocks& b, const RabitqQuery& pq, const Luts& lt, Scored ep,
                            std::size_t ef, VisitedSet& visited_set) {
  const VisitedSet::View visited = visited_set.view();
  thread_local std::vector<Scored> candidates;
  candidates.clear();
  std::vector<Scored> results;
  results.reserve(ef + 1);
  visited.test_and_set(ep.slot);
  candidates.push_back(ep);
  results.push_back(ep);
  std::uint32_t acc[kNb];
  while (!candidates.empty()) {
    const Scored c = candidates.front();
    if (results.size() >= ef && c.dist > results.front().dist) break;
    std::pop_heap(candidates.begin(), candidates.end(), detail::ScoredGreater{});
    candidates.pop_back();
    if (!candidates.empty()) {
      const std::uint8_t* nb = b.block(candidates.front().slot);
      for (std::size_t o = 0; o < kPrefetchBytes && o < b.bytes; o += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(nb + o), _MM_HINT_T0);
      }
    }
    const std::uint32_t* l = g.links(c.slot, 0);
    const std::size_t count = l[0];
    bool any = false;
    for (std::size_t j = 0; j < count && !any; ++j) any = !visited_set.test(l[1 + j]);
    if (!any) continue;
    const std::uint8_t* blk = b.block(c.slot);
    fastscan_avx2(blk, lt.lut.data(), b.groups, acc);
    const float* fx = reinterpret_cast<const float*>(blk + b.groups * 16);
    for (std::size_t j = 0; j < count; ++j) {
      const Slot n = l[1 + j];
      if (visited.test_and_set(n)) continue;
      const float dot = static_cast<float>(acc[j]) * lt.inv_scale + lt.sum_min;
      const float d = pq.c0 + fx[j] * (pq.c1 * dot + pq.c2);
      if (results.size() < ef || d < results.front().dist) {
        candidates.push_back({d, n});
        std::push_heap(candidates.begin(), candidates.end(), detail::ScoredGreater{});
        results.push_back({d, n});
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

std::vector<Scored> search_fs(const HnswIndex& g, const FsBlocks& b, const RabitqCodes& codes, const float* q,
                              std::size_t k, std::size_t ef, std::size_t depth) {
  auto& pq = code_query<RabitqCodes>(search_scratch());
  codes.prepare(q, pq);
  thread_local Luts lt;
  make_luts(pq, b.groups, lt);
  auto visited = g.visited_.acquire(g.levels_.size());
  const Scored ep = GraphSearch::descend(g, CodeScorer<RabitqCodes>(codes, pq), *visited);
  visited->reset(g.levels_.size());
  // The candidate list and re-rank of kbcore's RaBitQ search (max(ef, k, depth), the bounded
  // re-rank with each row's stored error bound: the FastScan estimate is within a few 1e-4 of
  // kbcore's, far inside the bound).
  const std::size_t width = std::max({ef, k, depth});
  std::vector<Scored> res = walk_fs(g, b, pq, lt, ep, width, *visited);
  return rerank_bounded(g.store_, codes, pq, g.metric_, q, std::move(res), std::max(depth, k), k);
}

// The SymphonyQG walk on the same graph: each node's block also holds its own float32 row, so
// that expanding a node reads one contiguous block for its exact distance and its neighbours'
// estimates. A pool of the `ef` best estimates (sorted, each with a checked flag) is walked
// best unchecked first; each checked node's exact distance goes to the k results; the walk ends
// when every pooled node is checked. No re-rank.
struct QgBlocks {
  std::size_t groups = 0;
  std::size_t raw_bytes = 0;  // dim floats, rounded to 64
  std::size_t bytes = 0;      // raw, codes (groups * 16), kNb floats F_x; a multiple of 64
  std::vector<std::uint8_t> data;
  const std::uint8_t* block(Slot s) const { return data.data() + static_cast<std::size_t>(s) * bytes; }
};

QgBlocks make_qg_blocks(const HnswIndex& g, const RabitqCodes& codes, const FsBlocks& fs) {
  QgBlocks b;
  b.groups = fs.groups;
  const std::size_t dim = g.store_.dim();
  b.raw_bytes = (dim * sizeof(float) + 63) / 64 * 64;
  b.bytes = b.raw_bytes + fs.bytes;
  const std::size_t n = g.levels_.size();
  b.data.assign(n * b.bytes + 64, 0);
  for (Slot s = 0; s < n; ++s) {
    std::uint8_t* p = b.data.data() + static_cast<std::size_t>(s) * b.bytes;
    std::memcpy(p, g.store_.vector(s), dim * sizeof(float));
    std::memcpy(p + b.raw_bytes, fs.block(s), fs.bytes);
  }
  (void)codes;
  return b;
}

struct Pooled {
  float est;
  Slot slot;
  bool checked;
};

std::vector<Scored> search_qg(const HnswIndex& g, const QgBlocks& b, const RabitqCodes& codes, const float* q,
                              std::size_t k, std::size_t ef) {
  auto& pq = code_query<RabitqCodes>(search_scratch());
  codes.prepare(q, pq);
  thread_local Luts lt;
  make_luts(pq, b.groups, lt);
  const std::size_t dim = g.store_.dim();
  const Kernels& kern = active_kernels();
  auto visited = g.visited_.acquire(g.levels_.size());
  const Scored ep = GraphSearch::descend(g, CodeScorer<RabitqCodes>(codes, pq), *visited);
  visited->reset(g.levels_.size());
  const VisitedSet::View vis = visited->view();
  const std::size_t width = std::max(ef, k);
  thread_local std::vector<Pooled> pool;  // ascending by est, at most width
  pool.clear();
  pool.push_back({ep.dist, ep.slot, false});
  vis.test_and_set(ep.slot);
  std::vector<Scored> results;  // max-heap of k exact
  results.reserve(k + 1);
  std::uint32_t acc[kNb];
  std::size_t first = 0;  // no unchecked entry before it
  while (first < pool.size()) {
    Pooled& c = pool[first];
    c.checked = true;
    const Slot cs = c.slot;
    const std::uint8_t* blk = b.block(cs);
    // The next unchecked entry's block starts loading now.
    std::size_t next = first + 1;
    while (next < pool.size() && pool[next].checked) ++next;
    if (next < pool.size()) {
      const std::uint8_t* nb = b.block(pool[next].slot);
      for (std::size_t o = 0; o < b.bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(nb + o), _MM_HINT_T0);
    }
    const float exact = 1.0f - kern.dot(q, reinterpret_cast<const float*>(blk), dim);
    if (results.size() < k) {
      results.push_back({exact, cs});
      std::push_heap(results.begin(), results.end());
    } else if (exact < results.front().dist) {
      std::pop_heap(results.begin(), results.end());
      results.back() = {exact, cs};
      std::push_heap(results.begin(), results.end());
    }
    fastscan_avx2(blk + b.raw_bytes, lt.lut.data(), b.groups, acc);
    const float* fx = reinterpret_cast<const float*>(blk + b.raw_bytes + b.groups * 16);
    const std::uint32_t* l = g.links(cs, 0);
    std::size_t lowest = pool.size();  // the first position an insertion touched
    for (std::size_t j = 0; j < l[0]; ++j) {
      const Slot n = l[1 + j];
      if (vis.test_and_set(n)) continue;
      const float dot = static_cast<float>(acc[j]) * lt.inv_scale + lt.sum_min;
      const float d = pq.c0 + fx[j] * (pq.c1 * dot + pq.c2);
      if (pool.size() >= width && d >= pool.back().est) continue;
      auto it = std::upper_bound(pool.begin(), pool.end(), d, [](float v, const Pooled& e) { return v < e.est; });
      const std::size_t pos = static_cast<std::size_t>(it - pool.begin());
      pool.insert(it, {d, n, false});
      if (pool.size() > width) pool.pop_back();
      lowest = std::min(lowest, pos);
    }
    first = std::min(next, lowest);
    while (first < pool.size() && pool[first].checked) ++first;
  }
  std::sort_heap(results.begin(), results.end());
  return results;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const auto rb = Index::load(dir + "/rabitq1.kbi");
  const auto sq = Index::load(dir + "/sq8.kbi");
  auto queries = read_all<float>(dir + "/queries.f32");
  const auto gt = read_all<std::int64_t>(dir + "/gt.i64");
  const std::size_t dim = rb->dim(), nq = queries.size() / dim, gt_k = gt.size() / nq, k = 10;
  for (std::size_t i = 0; i < nq; ++i) normalise(queries.data() + i * dim, dim);
  const HnswIndex& grb = *rb->graph_;
  const HnswIndex& gsq = *sq->graph_;
  const auto& rcodes = std::get<RabitqCodes>(*rb->codes_);
  const auto& scodes = std::get<Sq8Codes>(*sq->codes_);
  if (grb.m0_ != kNb) {
    std::fprintf(stderr, "m0 must be %zu\n", kNb);
    return 2;
  }
  const FsBlocks b = make_blocks(grb, rcodes);
  const QgBlocks qb = make_qg_blocks(grb, rcodes, b);
  std::printf("FastScan blocks: %zu B per node, %.1f MB; RaBitQ 1-bit rows %zu B; SQ8 rows %zu B\n", b.bytes,
              static_cast<double>(b.data.size()) / 1e6, rcodes.stride(), scodes.stride());
  // The AVX2 kernel against the scalar one, and the estimate against kbcore's exact-integer one.
  {
    auto& pq = code_query<RabitqCodes>(search_scratch());
    rcodes.prepare(queries.data(), pq);
    Luts lt;
    make_luts(pq, b.groups, lt);
    std::uint32_t a[kNb], s[kNb];
    double err = 0, spread = 0;
    std::size_t mism = 0, cnt = 0;
    for (Slot n = 0; n < 200; ++n) {
      fastscan_avx2(b.block(n), lt.lut.data(), b.groups, a);
      fastscan_scalar(b.block(n), lt.lut.data(), b.groups, s);
      const std::uint32_t* l = grb.links(n, 0);
      const float* fx = reinterpret_cast<const float*>(b.block(n) + b.groups * 16);
      for (std::size_t j = 0; j < kNb; ++j) mism += a[j] != s[j];
      for (std::size_t j = 0; j < l[0]; ++j) {
        const float dot = static_cast<float>(a[j]) * lt.inv_scale + lt.sum_min;
        const float est = pq.c0 + fx[j] * (pq.c1 * dot + pq.c2);
        const float ref = rcodes.distance(rcodes.kernels(), pq, l[1 + j]);
        err += std::fabs(est - ref);
        spread += std::fabs(ref - 1.0f);
        ++cnt;
      }
    }
    std::printf(
        "check: %zu AVX2/scalar mismatches; mean |FastScan - kbcore 1-bit estimate| %.5f (mean |est - 1| %.4f)\n", mism,
        err / static_cast<double>(cnt), spread / static_cast<double>(cnt));
  }
  const auto recall = [&](const Index& idx, const std::vector<std::vector<Scored>>& res) {
    std::size_t hit = 0;
    for (std::size_t i = 0; i < nq; ++i) {
      std::set<std::int64_t> want(gt.begin() + static_cast<std::ptrdiff_t>(i * gt_k),
                                  gt.begin() + static_cast<std::ptrdiff_t>(i * gt_k + k));
      for (const Scored& s : res[i]) hit += want.count(idx.store_.id_of(s.slot));
    }
    return static_cast<double>(hit) / static_cast<double>(nq * k);
  };
  constexpr int kVariants = 4;
  std::printf("QG blocks (own float32 row + FastScan block): %zu B per node\n", qb.bytes);
  std::printf("%5s | %-16s %7s %7s | %-16s %7s %7s | %-16s %7s %7s | %-16s %7s %7s\n", "ef", "kbcore sq8", "recall",
              "QPS", "kbcore rabitq1", "recall", "QPS", "fastscan walk", "recall", "QPS", "fastscan QG walk", "recall",
              "QPS");
  for (std::size_t ef : {10, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384}) {
    std::vector<std::vector<Scored>> res[kVariants];
    std::vector<double> times[kVariants];
    for (auto& r : res) r.resize(nq);
    for (int pass = 0; pass < 6; ++pass) {  // pass 0 warms up
      for (int v0 = 0; v0 < kVariants; ++v0) {
        const int v = (v0 + pass) % kVariants;
        const double t0 = cpu_now();
        for (std::size_t i = 0; i < nq; ++i) {
          const float* q = queries.data() + i * dim;
          if (v == 0) {
            res[v][i] = HnswCodeSearch::search(gsq, scodes, q, k, ef, sq->rerank_depth(ef, k), AcceptAll{});
          } else if (v == 1) {
            res[v][i] = HnswCodeSearch::search(grb, rcodes, q, k, ef, rb->rerank_depth(ef, k), AcceptAll{});
          } else if (v == 2) {
            res[v][i] = search_fs(grb, b, rcodes, q, k, ef, rb->rerank_depth(ef, k));
          } else {
            res[v][i] = search_qg(grb, qb, rcodes, q, k, ef);
          }
        }
        if (pass > 0) times[v].push_back(cpu_now() - t0);
      }
    }
    std::printf("%5zu", ef);
    for (int v = 0; v < kVariants; ++v) {
      std::sort(times[v].begin(), times[v].end());
      std::printf(" | %-16s %7.4f %7.0f", "", recall(v == 0 ? *sq : *rb, res[v]),
                  static_cast<double>(nq) / times[v][times[v].size() / 2]);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}
