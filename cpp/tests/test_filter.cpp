// Filters: filtered search against brute force, and match_filter against a per-row oracle.

#include <algorithm>
#include <functional>
#include <limits>
#include <random>
#include <string>
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
          for (const bool allow_predicate : {false, true}) {
            FilterMatches m = match_filter(c.f, meta, live, up_to, /*all_live=*/live.count() == n, allow_predicate);
            CHECK(m.count == want.size());
            CHECK(m.has_rows || m.has_bitmap || m.has_predicate);
            if (up_to >= want.size()) CHECK(m.has_rows);
            if (!allow_predicate) CHECK(!m.has_predicate);
            if (m.has_predicate) {
              // The predicate agrees with the oracle on every slot, dead ones included.
              std::size_t hits = 0;
              for (std::size_t i = 0; i < n; ++i) hits += m.predicate(static_cast<Slot>(i)) ? 1 : 0;
              CHECK(hits == want.size());
              for (Slot s : want) CHECK(m.predicate(s));
            }
            // Derive the bitmap first on odd thresholds, the rows first on even ones.
            if (up_to % 2 == 1) m.ensure_bitmap();
            std::vector<Slot> rows = m.ensure_rows();
            std::sort(rows.begin(), rows.end());
            CHECK(rows == want);  // each passing row exactly once
            const Bitmap& b = m.ensure_bitmap();
            CHECK(b.size() == n && b.count() == want.size());
            for (Slot s : want) CHECK(b.test(s));
          }
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

// compile_predicate against the index evaluation on a field holding every scalar kind (int,
// float, bool, str and missing rows), with operands at the int64 / double boundaries: for each
// slot, the predicate passes exactly the slots evaluate_filter passes, dead ones excluded.
KBCORE_TEST(slot_predicate_agrees_with_index_evaluation) {
  using namespace kbcore;
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  const std::size_t n = 3000;
  std::mt19937 rng(11);
  const std::vector<std::int64_t> int_pool = {-5, -1, 0, 2, 3, 5, kMin, kMax, kMax - 1};
  const std::vector<double> float_pool = {-2.5, 2.0, 2.5, 3.0, 1e19, -1e19, 9223372036854775808.0, -0.0};
  const std::vector<std::string> str_pool = {"a", "b", "c", ""};
  std::vector<std::uint8_t> vi(n), vf(n), vb(n), vs(n), bools(n);
  std::vector<std::int64_t> ints(n), offsets = {0};
  std::vector<double> floats(n);
  std::string chars;
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned kind = rng() % 5;  // 0 missing, 1 int, 2 float, 3 bool, 4 str
    vi[i] = kind == 1;
    vf[i] = kind == 2;
    vb[i] = kind == 3;
    vs[i] = kind == 4;
    ints[i] = int_pool[rng() % int_pool.size()];
    floats[i] = float_pool[rng() % float_pool.size()];
    bools[i] = rng() % 2;
    if (kind == 4) chars += str_pool[rng() % str_pool.size()];
    offsets.push_back(static_cast<std::int64_t>(chars.size()));
  }
  ColumnInput ci;
  ci.name = "x";
  ci.kind = ValueKind::kInt;
  ci.valid = vi.data();
  ci.ints = ints.data();
  ColumnInput cf = ci;
  cf.kind = ValueKind::kFloat;
  cf.valid = vf.data();
  cf.ints = nullptr;
  cf.floats = floats.data();
  ColumnInput cb = ci;
  cb.kind = ValueKind::kBool;
  cb.valid = vb.data();
  cb.ints = nullptr;
  cb.bools = bools.data();
  ColumnInput cs = ci;
  cs.kind = ValueKind::kStr;
  cs.valid = vs.data();
  cs.ints = nullptr;
  cs.offsets = offsets.data();
  cs.data = reinterpret_cast<const std::uint8_t*>(chars.data());
  cs.data_len = chars.size();
  MetadataStore::validate({ci, cf, cb, cs}, n);
  MetadataStore meta;
  meta.grow(n);
  std::vector<Slot> slots(n);
  for (std::size_t i = 0; i < n; ++i) slots[i] = static_cast<Slot>(i);
  meta.assign(slots, {ci, cf, cb, cs});
  Bitmap dead_some(n, true);
  for (std::size_t i = 0; i < n; ++i) {
    if (rng() % 5 == 0) dead_some.reset(i);
  }
  const Bitmap all_live(n, true);
  const Bitmap& some_dead = dead_some;
  std::vector<Operand> operands;
  for (std::int64_t x : {std::int64_t{2}, std::int64_t{3}, std::int64_t{-1}, kMin, kMax, kMax - 1}) {
    Operand o;
    o.kind = ValueKind::kInt;
    o.i = x;
    operands.push_back(o);
  }
  for (double x : {2.0, 2.5, -2.5, 9223372036854775807.0, -9223372036854775808.0, 1e19, -0.0, 0.0}) {
    Operand o;
    o.kind = ValueKind::kFloat;
    o.f = x;
    operands.push_back(o);
  }
  for (bool x : {false, true}) {
    Operand o;
    o.kind = ValueKind::kBool;
    o.b = x;
    operands.push_back(o);
  }
  for (const char* x : {"b", "", "zz"}) {
    Operand o;
    o.kind = ValueKind::kStr;
    o.s = x;
    operands.push_back(o);
  }
  std::size_t compiled = 0;
  for (const Operand& o : operands) {
    const bool number = o.kind == ValueKind::kInt || o.kind == ValueKind::kFloat;
    for (FilterOp op : {FilterOp::kEq, FilterOp::kIn, FilterOp::kGt, FilterOp::kGte, FilterOp::kLt, FilterOp::kLte}) {
      const bool range = op != FilterOp::kEq && op != FilterOp::kIn;
      if (range && !number) continue;  // validate_filter rejects a range on a bool or a string
      FilterNode f;
      f.field = "x";
      f.op = op;
      f.operands = {o};
      validate_filter(f);
      for (const Bitmap* live : {&some_dead, &all_live}) {
        const Bitmap want = evaluate_filter(f, meta, *live);
        SlotPredicate p;
        CHECK(compile_predicate(f, meta, live == &all_live ? nullptr : live, p));
        ++compiled;
        for (std::size_t i = 0; i < n; ++i) CHECK(p(static_cast<Slot>(i)) == want.test(i));
      }
    }
  }
  CHECK(compiled > 60);
  // Filters it does not cover are refused, leaving the evaluation to the bitmap.
  FilterNode ne;
  ne.field = "x";
  ne.op = FilterOp::kNe;
  ne.operands = {operands[0]};
  SlotPredicate p;
  CHECK(!compile_predicate(ne, meta, nullptr, p));
  FilterNode absent = ne;
  absent.op = FilterOp::kEq;
  absent.field = "no such field";
  CHECK(!compile_predicate(absent, meta, nullptr, p));
  FilterNode two = ne;
  two.op = FilterOp::kIn;
  two.operands = {operands[0], operands[1]};
  CHECK(!compile_predicate(two, meta, nullptr, p));
}
