// Native tests of the SQ8 quantizer and its kernels (sq8_codes.h), against exact oracles:
// every SIMD level equals the int64 reference sum bit for bit, encoding error is at most half
// a quantization step, out-of-range values clip, the approximate distance tracks the exact
// distance of the decoded row, and persistence round-trips and rejects corrupted sections.
#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "binary_io.h"
#include "distance.h"
#include "errors.h"
#include "filter_expr.h"
#include "index.h"
#include "sq8_codes.h"
#include "test_util.h"

using namespace kbcore_test;
using namespace kbcore;

namespace {

std::vector<float> random_rows(std::size_t n, std::size_t dim, std::uint64_t seed, float lo = -1, float hi = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n * dim);
  for (float& x : v) x = u(rng);
  return v;
}

std::int64_t reference_dot(const std::int16_t* q, const std::uint8_t* c, std::size_t n) {
  std::int64_t s = 0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<std::int64_t>(q[i]) * c[i];
  return s;
}

}  // namespace

KBCORE_TEST(kernels_equal_reference_at_every_level) {
  std::mt19937_64 rng(7);
  for (std::size_t dim : {1u, 3u, 31u, 63u, 64u, 65u, 100u, 384u, 1000u, 1536u}) {
    const std::size_t stride = sq8_stride(dim);
    const std::int32_t lim = sq8_query_limit(stride);
    std::uniform_int_distribution<int> qd(-lim, lim), cd(0, 255);
    AlignedVector<std::int16_t> q(stride, 0);
    std::vector<AlignedVector<std::uint8_t>> codes(4, AlignedVector<std::uint8_t>(stride, 0));
    for (int trial = 0; trial < 20; ++trial) {
      const bool extreme = trial < 2;  // |q| at the limit, codes 255: the largest sums
      for (std::size_t i = 0; i < dim; ++i) q[i] = static_cast<std::int16_t>(extreme ? (trial ? -lim : lim) : qd(rng));
      for (auto& c : codes)
        for (std::size_t i = 0; i < dim; ++i) c[i] = static_cast<std::uint8_t>(extreme ? 255 : cd(rng));
      const std::uint8_t* rows[4] = {codes[0].data(), codes[1].data(), codes[2].data(), codes[3].data()};
      for (SimdLevel level : supported_simd_levels()) {
        const Sq8Kernels& k = sq8_kernels_for(level);
        std::int32_t out[4];
        k.dot4(q.data(), rows, stride, out);
        for (int j = 0; j < 4; ++j) {
          const std::int64_t want = reference_dot(q.data(), rows[j], stride);
          CHECK(want <= 2147483647 && want >= -2147483647);
          CHECK(k.dot(q.data(), rows[j], stride) == want);
          CHECK(out[j] == want);
        }
      }
    }
  }
}

KBCORE_TEST(int8_query_kernels_equal_reference) {
  // Levels with dot_i8 (AVX-512 VNNI) must give the int16 kernels' sums on queries within
  // kSq8QueryMax, extremes included; every level's dot / dot4 too on such queries.
  std::mt19937_64 rng(17);
  for (std::size_t dim : {1u, 3u, 63u, 64u, 65u, 127u, 128u, 129u, 384u, 1536u}) {
    const std::size_t stride = sq8_stride(dim);
    std::uniform_int_distribution<int> qd(-kSq8QueryMax, kSq8QueryMax), cd(0, 255);
    AlignedVector<std::int16_t> q(stride, 0);
    AlignedVector<std::int8_t> q8(stride, 0);
    std::vector<AlignedVector<std::uint8_t>> codes(4, AlignedVector<std::uint8_t>(stride, 0));
    for (int trial = 0; trial < 20; ++trial) {
      const int extreme = trial < 2 ? (trial ? -kSq8QueryMax : kSq8QueryMax) : 0;
      for (std::size_t i = 0; i < dim; ++i) {
        q[i] = static_cast<std::int16_t>(extreme != 0 ? extreme : qd(rng));
        q8[i] = static_cast<std::int8_t>(q[i]);
      }
      for (auto& c : codes)
        for (std::size_t i = 0; i < dim; ++i) c[i] = static_cast<std::uint8_t>(extreme != 0 ? 255 : cd(rng));
      const std::uint8_t* rows[4] = {codes[0].data(), codes[1].data(), codes[2].data(), codes[3].data()};
      for (SimdLevel level : supported_simd_levels()) {
        const Sq8Kernels& k = sq8_kernels_for(level);
        CHECK((k.dot_i8 == nullptr) == (k.dot4_i8 == nullptr));
        std::int32_t out[4], out8[4];
        k.dot4(q.data(), rows, stride, out);
        if (k.dot4_i8 != nullptr) k.dot4_i8(q8.data(), rows, stride, out8);
        for (int j = 0; j < 4; ++j) {
          const std::int64_t want = reference_dot(q.data(), rows[j], stride);
          CHECK(out[j] == want);
          if (k.dot_i8 != nullptr) {
            CHECK(k.dot_i8(q8.data(), rows[j], stride) == want);
            CHECK(out8[j] == want);
          }
        }
      }
    }
  }
}

KBCORE_TEST(encoding_error_is_at_most_half_a_step_and_out_of_range_clips) {
  const std::size_t dim = 37, n = 500;
  const auto rows = random_rows(n, dim, 11, -3, 5);
  Sq8Codes codes(dim, Metric::kL2);
  codes.train(rows.data(), n);
  codes.resize(n + 1);
  std::vector<float> dec(dim);
  for (std::size_t s = 0; s < n; ++s) {
    codes.encode(static_cast<std::uint32_t>(s), rows.data() + s * dim);
    codes.decode(static_cast<std::uint32_t>(s), dec.data());
    for (std::size_t d = 0; d < dim; ++d) {
      CHECK(std::fabs(dec[d] - rows[s * dim + d]) <= codes.scale()[d] * 0.5f + 1e-5f);
    }
    for (std::size_t d = dim; d < codes.stride(); ++d) CHECK(codes.code(static_cast<std::uint32_t>(s))[d] == 0);
  }
  std::vector<float> far(dim);
  for (std::size_t d = 0; d < dim; ++d) far[d] = d % 2 ? 100.0f : -100.0f;
  codes.encode(static_cast<std::uint32_t>(n), far.data());
  for (std::size_t d = 0; d < dim; ++d) CHECK(codes.code(static_cast<std::uint32_t>(n))[d] == (d % 2 ? 255 : 0));
}

KBCORE_TEST(constant_dimension_decodes_exactly) {
  std::vector<float> rows = random_rows(50, 4, 3);
  for (std::size_t i = 0; i < 50; ++i) rows[i * 4 + 2] = 0.25f;
  Sq8Codes codes(4, Metric::kIp);
  codes.train(rows.data(), 50);
  CHECK(codes.scale()[2] == 0.0f);
  codes.resize(50);
  std::vector<float> dec(4);
  for (std::uint32_t s = 0; s < 50; ++s) {
    codes.encode(s, rows.data() + s * 4);
    codes.decode(s, dec.data());
    CHECK(dec[2] == 0.25f);
  }
}

KBCORE_TEST(training_rejects_empty_and_non_finite) {
  Sq8Codes codes(3, Metric::kL2);
  bool threw = false;
  try {
    codes.train(nullptr, 0);
  } catch (const InvalidArgument&) {
    threw = true;
  }
  CHECK(threw);
  std::vector<float> rows = {1, 2, NAN};
  threw = false;
  try {
    codes.train(rows.data(), 1);
  } catch (const InvalidArgument&) {
    threw = true;
  }
  CHECK(threw && !codes.trained());
}

// The approximate distance equals the exact distance of the query to the decoded row up to
// the rounding of the query to integers: each folded entry moves by at most half a step a, so
// the distance moves by at most |c1| / 2 * sum_d c_d (c1 = -a, or -2a for L2), plus float
// rounding.
KBCORE_TEST(approximate_distance_tracks_the_decoded_row) {
  const std::size_t dim = 96, n = 300;
  for (Metric metric : {Metric::kL2, Metric::kIp, Metric::kCosine}) {
    const auto rows = random_rows(n, dim, 21);
    const auto queries = random_rows(20, dim, 22);
    Sq8Codes codes(dim, metric);
    codes.train(rows.data(), n);
    codes.resize(n);
    for (std::uint32_t s = 0; s < n; ++s) codes.encode(s, rows.data() + s * dim);
    const Kernels& fk = kernels_for(SimdLevel::kScalar);
    std::vector<float> dec(dim);
    Sq8Query pq;
    for (std::size_t qi = 0; qi < 20; ++qi) {
      const float* q = queries.data() + qi * dim;
      codes.prepare(q, pq);
      for (std::uint32_t s = 0; s < n; ++s) {
        codes.decode(s, dec.data());
        const float want = distance(fk, metric, q, dec.data(), dim);
        float code_sum = 0;
        for (std::size_t d = 0; d < dim; ++d) code_sum += static_cast<float>(codes.code(s)[d]);
        const float bound = std::fabs(pq.c1) / 2 * code_sum + 1e-4f * (1.0f + std::fabs(want));
        for (SimdLevel level : supported_simd_levels()) {
          const float got = codes.distance(sq8_kernels_for(level), pq, s);
          CHECK(std::fabs(got - want) <= bound);
          CHECK(got == codes.distance(sq8_kernels_for(SimdLevel::kScalar), pq, s));
        }
      }
    }
  }
}

KBCORE_TEST(persistence_round_trips_and_rejects_corruption) {
  const std::size_t dim = 70, n = 40;
  const auto rows = random_rows(n, dim, 31);
  Sq8Codes codes(dim, Metric::kL2);
  codes.train(rows.data(), n);
  codes.resize(n);
  for (std::uint32_t s = 0; s < n; ++s) codes.encode(s, rows.data() + s * dim);
  const std::string path = "/tmp/kbcore_sq8_test_" + std::to_string(::getpid()) + ".bin";
  const char magic[8] = {'K', 'B', 'S', 'Q', '8', 'T', 'S', 'T'};
  {
    BinaryWriter w(path, magic, 1);
    codes.save(w);
    w.commit();
  }
  {
    BinaryReader r(path, magic, 1);
    Sq8Codes back(dim, Metric::kL2);
    back.load(r);
    r.expect_end();
    CHECK(back.slot_count() == n && back.lo() == codes.lo() && back.scale() == codes.scale());
    CHECK(std::memcmp(back.code(0), codes.code(0), n * codes.stride()) == 0);
    for (std::uint32_t s = 0; s < n; ++s) CHECK(back.term(s) == codes.term(s));
  }
  {
    // A wrong dimension is refused.
    BinaryReader r(path, magic, 1);
    Sq8Codes other(dim + 1, Metric::kL2);
    bool threw = false;
    try {
      other.load(r);
    } catch (const FormatError&) {
      threw = true;
    }
    CHECK(threw);
  }
  {
    // A nonzero padding byte (written through a crafted file with a valid checksum) is refused.
    Sq8Codes bad(dim, Metric::kL2);
    bad.train(rows.data(), n);
    bad.resize(1);
    bad.encode(0, rows.data());
    BinaryWriter w(path, magic, 1);
    w.u64(dim);
    w.u64(bad.stride());
    w.u8(1);
    w.array(bad.lo().data(), dim);
    w.array(bad.scale().data(), dim);
    w.u64(1);
    std::vector<std::uint8_t> row(bad.code(0), bad.code(0) + bad.stride());
    row[dim] = 1;
    w.array(row.data(), row.size());
    w.commit();
    BinaryReader r(path, magic, 1);
    Sq8Codes back(dim, Metric::kL2);
    bool threw = false;
    try {
      back.load(r);
    } catch (const FormatError&) {
      threw = true;
    }
    CHECK(threw);
  }
  std::remove(path.c_str());
}

// A quantized Index (graph walked on codes, exact re-rank) against brute force: every returned
// distance is the exact one, recall stays high, through removals, slot reuse, the exact filtered
// scan and a save/load round trip (under ASan in CI, this covers hnsw_codes.h's memory accesses).
KBCORE_TEST(quantized_index_answers_at_exact_distances) {
  const std::size_t dim = 40, n = 2500, nq = 20, k = 10;
  for (Metric metric : {Metric::kL2, Metric::kIp, Metric::kCosine}) {
    auto rows = random_rows(n, dim, 41);
    const auto queries = random_rows(nq, dim, 42);
    IndexConfig c;
    c.dim = dim;
    c.metric = metric;
    c.hnsw.M = 8;
    c.hnsw.ef_construction = 64;
    c.quantization = "sq8";
    Index index(c);
    std::vector<std::int64_t> ids(n);
    for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<std::int64_t>(i);
    index.add(rows.data(), ids.data(), n, 1);
    CHECK(index.quantizer_trained());
    std::vector<std::int64_t> gone;
    for (std::int64_t i = 0; i < 300; ++i) gone.push_back(i * 7);
    index.remove(gone.data(), gone.size(), 1);
    const auto fresh = random_rows(300, dim, 43);
    std::vector<std::int64_t> fresh_ids(300);
    for (std::size_t i = 0; i < 300; ++i) fresh_ids[i] = static_cast<std::int64_t>(100000 + i);
    index.add(fresh.data(), fresh_ids.data(), 300, 1);
    // The live rows as stored (cosine rows normalised), by id.
    std::map<std::int64_t, std::vector<float>> live;
    for (std::int64_t id : index.ids()) {
      std::vector<float> v(dim);
      index.get_vectors(&id, 1, v.data());
      live[id] = v;
    }
    const Kernels& fk = kernels_for(SimdLevel::kScalar);
    std::vector<std::int64_t> got(nq * k);
    std::vector<float> dist(nq * k);
    index.search(queries.data(), nq, params(k, 64, 1), got.data(), dist.data());
    std::size_t hits = 0;
    for (std::size_t qi = 0; qi < nq; ++qi) {
      std::vector<float> q(queries.begin() + qi * dim, queries.begin() + (qi + 1) * dim);
      if (metric == Metric::kCosine) {
        double s2 = 0;
        for (float x : q) s2 += double(x) * x;
        for (float& x : q) x = static_cast<float>(x / std::sqrt(s2));
      }
      std::vector<float> all;
      for (const auto& [id, v] : live) all.push_back(distance(fk, metric, q.data(), v.data(), dim));
      std::sort(all.begin(), all.end());
      for (std::size_t j = 0; j < k; ++j) {
        const std::int64_t id = got[qi * k + j];
        CHECK(live.count(id) == 1);
        const float want = distance(fk, metric, q.data(), live[id].data(), dim);
        CHECK(std::fabs(dist[qi * k + j] - want) <= 1e-4f * (1 + std::fabs(want)));
        if (dist[qi * k + j] <= all[k - 1] + 1e-5f) ++hits;
      }
    }
    CHECK(hits >= nq * k * 9 / 10);
    const std::string path = "/tmp/kbcore_sq8_index_" + std::to_string(::getpid()) + ".kbi";
    index.save(path);
    auto back = Index::load(path);
    std::remove(path.c_str());
    std::vector<std::int64_t> got2(nq * k);
    std::vector<float> dist2(nq * k);
    back->search(queries.data(), nq, params(k, 64, 1), got2.data(), dist2.data());
    CHECK(got2 == got && dist2 == dist);
  }
}

// Large AlignedVector blocks are mapped 2 MiB aligned (huge-page eligible) whatever the switch
// says, keep their contents through growth, and small ones stay cache-line aligned; the
// switch is process-wide and restored here.
KBCORE_TEST(large_aligned_arrays_are_huge_page_aligned_through_growth) {
  const bool was = huge_pages_enabled();
  for (bool on : {true, false}) {
    set_huge_pages_enabled(on);
    CHECK(huge_pages_enabled() == on);
    AlignedVector<std::uint32_t> v(16);
    CHECK(reinterpret_cast<std::uintptr_t>(v.data()) % AlignedAllocator<std::uint32_t>::kAlign == 0);
    for (std::uint32_t i = 0; i < 16; ++i) v[i] = i * 7 + 1;
    v.resize(kHugeMinBytes / sizeof(std::uint32_t) + 5, 3);  // crosses the threshold
    if (huge_pages_supported()) CHECK(reinterpret_cast<std::uintptr_t>(v.data()) % kHugePageBytes == 0);
    for (std::uint32_t i = 0; i < 16; ++i) CHECK(v[i] == i * 7 + 1);
    CHECK(v.back() == 3);
    v.resize(v.size() * 2, 9);  // reallocates a large block into a larger one
    if (huge_pages_supported()) CHECK(reinterpret_cast<std::uintptr_t>(v.data()) % kHugePageBytes == 0);
    for (std::uint32_t i = 0; i < 16; ++i) CHECK(v[i] == i * 7 + 1);
    CHECK(v.back() == 9);
    AlignedVector<std::uint32_t>().swap(v);
  }
  set_huge_pages_enabled(was);
  CHECK(detail::huge_round(1) == kHugePageBytes);
  CHECK(detail::huge_round(kHugePageBytes) == kHugePageBytes);
  CHECK(detail::huge_round(kHugePageBytes + 1) == 2 * kHugePageBytes);
}

KBCORE_TEST(permuted_codes_equal_the_permuted_rows_encoded_and_sizes_are_checked) {
  // Index::reorder moves the codes instead of encoding the moved rows again: both must give
  // the same bytes and L2 terms, slot for slot.
  const std::size_t dim = 37, n = 300;
  const auto rows = random_rows(n, dim, 23, -2, 3);
  Sq8Codes moved(dim, Metric::kL2), fresh(dim, Metric::kL2);
  moved.train(rows.data(), n);
  fresh.set_params(moved.lo(), moved.scale());
  moved.resize(n);
  fresh.resize(n);
  std::vector<std::uint32_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = static_cast<std::uint32_t>((i * 7 + 3) % n);  // 7 and 300 coprime
  for (std::uint32_t s = 0; s < n; ++s) {
    moved.encode(s, rows.data() + s * dim);
    fresh.encode(s, rows.data() + static_cast<std::size_t>(order[s]) * dim);
  }
  moved.permute_slots(order);
  for (std::uint32_t s = 0; s < n; ++s) {
    CHECK(std::memcmp(moved.code(s), fresh.code(s), moved.stride()) == 0);
    CHECK(moved.term(s) == fresh.term(s));
  }
  bool threw = false;
  try {
    moved.permute_slots(std::vector<std::uint32_t>(n - 1, 0));
  } catch (const InvalidArgument&) {
    threw = true;
  }
  CHECK(threw);
}
