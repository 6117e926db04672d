// Filters: filtered search against brute force, and match_filter against a per-row oracle.

#include <algorithm>
#include <functional>
#include <random>
#include <vector>

#include "filter_expr.h"
#include "index.h"
#include "metadata_store.h"
#include "test_util.h"

using namespace kbcore_test;

KBCORE_TEST(flat_is_exact_and_filters) {
  const std::size_t n = 800, dim = 16, k = 7;
  auto x = clustered(n, dim, 3);
  std::vector<std::int64_t> ids(n), tag(n);
  std::vector<std::uint8_t> valid(n, 1);
  for (std::size_t i = 0; i < n; ++i) {
    ids[i] = static_cast<std::int64_t>(i);
    tag[i] = static_cast<std::int64_t>(i % 10);
  }
  kbcore::ColumnInput col;
  col.name = "tag";
  col.kind = kbcore::ValueKind::kInt;
  col.valid = valid.data();
  col.ints = tag.data();
  for (auto kind : {kbcore::IndexKind::kFlat, kbcore::IndexKind::kHnsw}) {
    kbcore::Index index(config(dim, kind));
    index.add(x.data(), ids.data(), n, 1, {col});
    kbcore::FilterNode f;
    f.field = "tag";
    f.op = kbcore::FilterOp::kLt;
    kbcore::Operand o;
    o.kind = kbcore::ValueKind::kInt;
    o.i = 2;
    f.operands.push_back(o);
    CHECK(index.count(f) == n / 5);
    auto q = clustered(20, dim, 4);
    std::vector<std::int64_t> out(20 * k);
    std::vector<float> d(20 * k);
    index.search(q.data(), 20, params(k, 0, 1, &f), out.data(), d.data());
    for (std::size_t i = 0; i < 20; ++i) {
      std::vector<std::int64_t> got(out.begin() + i * k, out.begin() + (i + 1) * k);
      const auto want = exact_topk(x, ids, q.data() + i * dim, dim, k, [&](std::size_t r) { return tag[r] < 2; });
      for (auto g : got) CHECK(g >= 0 && tag[static_cast<std::size_t>(g)] < 2);
      if (kind == kbcore::IndexKind::kFlat) CHECK(got == want);
    }
  }
}

// match_filter against a per-row oracle: the count, the bitmap and the list (in any order) agree
// for single-key leaves (rows straight from the index), multi-key ranges, $in, negations and
// AND / OR trees, with dead slots, at every rows_up_to threshold.
KBCORE_TEST(match_filter_agrees_with_oracle) {
  using namespace kbcore;
  std::mt19937 rng(7);
  // 20000 rows with 2000 values: few rows pass the small ranges and $in (the list read
  // straight from the index, several keys' runs one after the other).
  for (const std::size_t n :
       {std::size_t{1}, std::size_t{63}, std::size_t{64}, std::size_t{65}, std::size_t{1000}, std::size_t{20000}}) {
    for (const bool with_dead : {true, false}) {
      std::vector<std::int64_t> val(n);
      std::vector<std::uint8_t> valid(n);
      const std::uint32_t values = n >= 20000 ? 2000 : 20;
      for (std::size_t i = 0; i < n; ++i) {
        val[i] = static_cast<std::int64_t>(rng() % values);
        valid[i] = rng() % 10 != 0;  // some rows lack the field
      }
      ColumnInput col;
      col.name = "v";
      col.kind = ValueKind::kInt;
      col.valid = valid.data();
      col.ints = val.data();
      MetadataStore meta;
      meta.grow(n);
      std::vector<Slot> slots(n);
      for (std::size_t i = 0; i < n; ++i) slots[i] = static_cast<Slot>(i);
      meta.assign(slots, {col});
      Bitmap live(n, true);
      // Dead slots keep their metadata here and must not pass; without them match_filter is
      // told that every slot is live.
      if (with_dead) {
        for (std::size_t i = 0; i < n; ++i) {
          if (rng() % 7 == 0) live.reset(i);
        }
      }
      const auto leaf = [](FilterOp op, std::vector<std::int64_t> xs) {
        FilterNode f;
        f.field = "v";
        f.op = op;
        for (std::int64_t x : xs) {
          Operand o;
          o.kind = ValueKind::kInt;
          o.i = x;
          f.operands.push_back(o);
        }
        return f;
      };
      const auto tree = [](FilterNode::Type t, std::vector<FilterNode> c) {
        FilterNode f;
        f.type = t;
        f.children = std::move(c);
        return f;
      };
      struct Case {
        FilterNode f;
        std::function<bool(std::int64_t)> pass;  // on a present value; missing rows never pass here
      };
      std::vector<Case> cases = {
          {leaf(FilterOp::kEq, {3}), [](std::int64_t x) { return x == 3; }},
          {leaf(FilterOp::kEq, {99}), [](std::int64_t x) { return x == 99; }},
          {leaf(FilterOp::kLt, {5}), [](std::int64_t x) { return x < 5; }},
          {leaf(FilterOp::kGte, {19}), [](std::int64_t x) { return x >= 19; }},
          {leaf(FilterOp::kLte, {100}), [](std::int64_t x) { return x <= 100; }},
          {leaf(FilterOp::kIn, {2, 7}), [](std::int64_t x) { return x == 2 || x == 7; }},
          {leaf(FilterOp::kIn, {4}), [](std::int64_t x) { return x == 4; }},
          {tree(FilterNode::Type::kAnd, {leaf(FilterOp::kGt, {3}), leaf(FilterOp::kLt, {9})}),
           [](std::int64_t x) { return x > 3 && x < 9; }},
          {tree(FilterNode::Type::kOr, {leaf(FilterOp::kEq, {1}), leaf(FilterOp::kEq, {18})}),
           [](std::int64_t x) { return x == 1 || x == 18; }},
      };
      for (const Case& c : cases) {
        std::vector<Slot> want;
        for (std::size_t i = 0; i < n; ++i) {
          if (live.test(i) && valid[i] && c.pass(val[i])) want.push_back(static_cast<Slot>(i));
        }
        CHECK(evaluate_filter(c.f, meta, live).count() == want.size());
        for (const std::size_t up_to : {std::size_t{0}, want.size() ? want.size() - 1 : 0, want.size(), n}) {
          FilterMatches m = match_filter(c.f, meta, live, up_to, /*all_live=*/live.count() == n);
          CHECK(m.count == want.size());
          CHECK(m.has_rows || m.has_bitmap);
          if (up_to >= want.size()) CHECK(m.has_rows);
          std::vector<Slot> rows = m.ensure_rows();
          std::sort(rows.begin(), rows.end());
          CHECK(rows == want);  // each passing row exactly once
          const Bitmap& b = m.ensure_bitmap();
          CHECK(b.size() == n && b.count() == want.size());
          for (Slot s : want) CHECK(b.test(s));
        }
      }
      // ne: rows lacking the field pass too.
      FilterMatches ne = match_filter(leaf(FilterOp::kNe, {3}), meta, live, n);
      std::vector<Slot> want_ne;
      for (std::size_t i = 0; i < n; ++i) {
        if (live.test(i) && !(valid[i] && val[i] == 3)) want_ne.push_back(static_cast<Slot>(i));
      }
      std::vector<Slot> ne_rows = ne.ensure_rows();
      std::sort(ne_rows.begin(), ne_rows.end());
      CHECK(ne.count == want_ne.size() && ne_rows == want_ne);
    }
  }
  // to_slots on dense and sparse words, and a wrong count never writes past its buffer.
  Bitmap b(200);
  for (std::size_t i : {0, 1, 2, 3, 63, 64, 100, 127, 128, 129, 199}) b.set(i);
  const std::vector<std::uint32_t> want = {0, 1, 2, 3, 63, 64, 100, 127, 128, 129, 199};
  CHECK(b.to_slots(b.count()) == want);
  CHECK(b.to_slots(3).size() == 3);
  CHECK(b.to_slots(0).empty());
}
