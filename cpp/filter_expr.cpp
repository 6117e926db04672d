#include "filter_expr.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "errors.h"

namespace kbcore {
namespace {

template <typename K>
void set_all(Bitmap& out, Entries<K> entries) {
  for (const auto& e : entries) out.set(e.second);
}

void set_into(const LeafRuns& runs, Bitmap& out) {
  runs.for_each_slot([&](Slot s) { out.set(s); });
}

constexpr double kTwo63 = 9223372036854775808.0;
constexpr std::int64_t kMinI = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t kMaxI = std::numeric_limits<std::int64_t>::max();
constexpr double kInfD = std::numeric_limits<double>::infinity();

// Exact comparison of a double with an int64 (no rounding): -1, 0 or 1.
int cmp_double_int(double d, std::int64_t i) {
  if (d < -kTwo63) return -1;
  if (d >= kTwo63) return 1;
  const auto t = static_cast<std::int64_t>(d);  // truncates; exact for |d| < 2^63
  if (t != i) return t < i ? -1 : 1;
  const double frac = d - static_cast<double>(t);  // exact: same binade
  return frac < 0 ? -1 : (frac > 0 ? 1 : 0);
}

// The int64 interval [lo, hi] of integers n with n >= / > the operand (lower) or
// n <= / < it (upper); `empty` when none.
struct IntBounds {
  std::int64_t lo = kMinI;
  std::int64_t hi = kMaxI;
  bool empty = false;
};

void int_lower(IntBounds& b, const Operand& o, bool incl) {
  if (o.kind == ValueKind::kInt) {
    if (incl)
      b.lo = std::max(b.lo, o.i);
    else if (o.i == kMaxI)
      b.empty = true;
    else
      b.lo = std::max(b.lo, o.i + 1);
    return;
  }
  const double x = o.f;
  if (x < -kTwo63) return;
  const double c = std::ceil(x);
  if (c >= kTwo63) {
    b.empty = true;
    return;
  }
  std::int64_t n = static_cast<std::int64_t>(c);
  if (!incl && c == x) {
    if (n == kMaxI) {
      b.empty = true;
      return;
    }
    ++n;
  }
  b.lo = std::max(b.lo, n);
}

void int_upper(IntBounds& b, const Operand& o, bool incl) {
  if (o.kind == ValueKind::kInt) {
    if (incl)
      b.hi = std::min(b.hi, o.i);
    else if (o.i == kMinI)
      b.empty = true;
    else
      b.hi = std::min(b.hi, o.i - 1);
    return;
  }
  const double x = o.f;
  if (x >= kTwo63) return;
  const double f = std::floor(x);
  if (f < -kTwo63) {
    b.empty = true;
    return;
  }
  std::int64_t n = static_cast<std::int64_t>(f);
  if (!incl && f == x) {
    if (n == kMinI) {
      b.empty = true;
      return;
    }
    --n;
  }
  b.hi = std::min(b.hi, n);
}

// Smallest double d with d >= (incl) or > (excl) the operand, exactly.
double double_lower(const Operand& o, bool incl) {
  if (o.kind == ValueKind::kFloat) return incl ? o.f : std::nextafter(o.f, kInfD);
  double d = static_cast<double>(o.i);
  const int c = cmp_double_int(d, o.i);
  if (c < 0 || (c == 0 && !incl)) d = std::nextafter(d, kInfD);
  return d;
}

// Largest double d with d <= (incl) or < (excl) the operand, exactly.
double double_upper(const Operand& o, bool incl) {
  if (o.kind == ValueKind::kFloat) return incl ? o.f : std::nextafter(o.f, -kInfD);
  double d = static_cast<double>(o.i);
  const int c = cmp_double_int(d, o.i);
  if (c > 0 || (c == 0 && !incl)) d = std::nextafter(d, -kInfD);
  return d;
}

// Rows whose numeric value (int or float row) lies between the bounds; a null bound is
// open. Int and float rows are compared with the operand exactly, never through a rounding.
void numeric_range(LeafRuns& out, const FieldIndex& f, const Operand* lo, bool lo_incl, const Operand* hi,
                   bool hi_incl) {
  if (f.has_floats()) {
    const double flo = lo ? double_lower(*lo, lo_incl) : -kInfD;
    const double fhi = hi ? double_upper(*hi, hi_incl) : kInfD;
    if (flo <= fhi) out.add(f.floats_between(flo, fhi));
  }
  if (f.has_ints()) {
    IntBounds b;
    if (lo) int_lower(b, *lo, lo_incl);
    if (hi) int_upper(b, *hi, hi_incl);
    if (!b.empty && b.lo <= b.hi) out.add(f.ints_between(b.lo, b.hi));
  }
}

void eq_value(LeafRuns& out, const FieldIndex& f, const Operand& v, const StringDict& dict) {
  switch (v.kind) {
    case ValueKind::kInt:
    case ValueKind::kFloat:
      numeric_range(out, f, &v, true, &v, true);
      break;
    case ValueKind::kBool:
      out.add(f.bool_entries(v.b));
      break;
    case ValueKind::kStr:
      if (const auto id = dict.find(v.s)) out.add(f.str_entries(*id));
      break;
    default:
      break;
  }
}

// Rows whose str value satisfies pred(dictionary id).
template <typename Pred>
void str_where(LeafRuns& out, const FieldIndex& f, Pred pred) {
  for (const StrRun& run : f.str_runs()) {
    if (pred(run.id)) out.add(run.rows);
  }
}

void present(Bitmap& out, const Field& f) {
  const std::vector<std::uint8_t>& kinds = f.kinds();
  for (std::size_t s = 0; s < kinds.size(); ++s) {
    if (kinds[s] != 0) out.set(s);
  }
}

// Rows of a value test ($eq / $in, and the complement of $ne / $nin).
void value_runs(LeafRuns& out, const FilterNode& n, const FieldIndex& f, const StringDict& dict) {
  for (const Operand& o : n.operands) eq_value(out, f, o, dict);
}

// Rows whose str value contains the operand, or whose string list holds it.
void contains_runs(LeafRuns& out, const FieldIndex& f, const std::string& v, const StringDict& dict) {
  str_where(out, f, [&](std::uint32_t id) { return dict.str(id).find(v) != std::string::npos; });
  if (const auto id = dict.find(v)) out.add(f.list_entries(*id));
}

// The runs of a leaf that passes exactly the rows of some index entries; false for the
// leaves that need a complement or a per-slot pass (negations, exists, empty).
bool leaf_runs(LeafRuns& out, const FilterNode& n, const FieldIndex& f, const StringDict& dict) {
  const Operand& v = n.operands[0];
  switch (n.op) {
    case FilterOp::kEq:
    case FilterOp::kIn:
      value_runs(out, n, f, dict);
      return true;
    case FilterOp::kGt:
      numeric_range(out, f, &v, false, nullptr, true);
      return true;
    case FilterOp::kGte:
      numeric_range(out, f, &v, true, nullptr, true);
      return true;
    case FilterOp::kLt:
      numeric_range(out, f, nullptr, true, &v, false);
      return true;
    case FilterOp::kLte:
      numeric_range(out, f, nullptr, true, &v, true);
      return true;
    case FilterOp::kContains:
      contains_runs(out, f, v.s, dict);
      return true;
    case FilterOp::kStartsWith:
      str_where(out, f, [&](std::uint32_t id) { return dict.str(id).compare(0, v.s.size(), v.s) == 0; });
      return true;
    case FilterOp::kEndsWith:
      str_where(out, f, [&](std::uint32_t id) {
        const std::string& s = dict.str(id);
        return s.size() >= v.s.size() && s.compare(s.size() - v.s.size(), v.s.size(), v.s) == 0;
      });
      return true;
    case FilterOp::kBefore:
      str_where(out, f, [&](std::uint32_t id) { return dict.instant(id) < v.f; });
      return true;
    case FilterOp::kAfter:
      str_where(out, f, [&](std::uint32_t id) { return dict.instant(id) > v.f; });
      return true;
    default:
      return false;
  }
}

// The field a leaf reads, or null when no row has the field.
const Field* present_field(const FilterNode& n, const MetadataStore& meta) {
  const Field* f = meta.field(n.field);
  return f == nullptr || f->present_count() == 0 ? nullptr : f;
}

Bitmap eval_cmp(const FilterNode& n, const MetadataStore& meta, const Bitmap& live) {
  Bitmap out(live.size());
  const Field* f = present_field(n, meta);
  if (f == nullptr) {
    // No row has the field: negations and "absent" tests pass every live row.
    const bool all = n.op == FilterOp::kNe || n.op == FilterOp::kNin ||
                     (n.op == FilterOp::kExists && !n.operands[0].b) || (n.op == FilterOp::kEmpty && n.operands[0].b);
    return all ? live : out;
  }
  const StringDict& dict = meta.dict();
  const Operand& v = n.operands[0];
  const FieldIndex& idx = f->index();
  LeafRuns runs;
  if (leaf_runs(runs, n, idx, dict)) {
    set_into(runs, out);
    return out;
  }
  switch (n.op) {
    case FilterOp::kNe:
    case FilterOp::kNin: {
      value_runs(runs, n, idx, dict);
      set_into(runs, out);
      Bitmap all = live;
      all.subtract(out);
      return all;
    }
    case FilterOp::kNotContains: {
      // Present as a string or a list, and not containing.
      contains_runs(runs, idx, v.s, dict);
      Bitmap hit(live.size());
      set_into(runs, hit);
      set_all(out, idx.all_strs());
      const std::vector<std::uint8_t>& kinds = f->kinds();
      for (std::size_t s = 0; s < kinds.size(); ++s) {
        if (kinds[s] == static_cast<std::uint8_t>(ValueKind::kStrList)) out.set(s);
      }
      out.subtract(hit);
      return out;
    }
    case FilterOp::kExists:
      present(out, *f);
      if (!v.b) {
        Bitmap all = live;
        all.subtract(out);
        return all;
      }
      return out;
    case FilterOp::kEmpty: {
      // Non-empty values: any present value except "" and [].
      Bitmap nonempty(live.size());
      const auto empty_id = dict.find("");
      const std::vector<std::uint8_t>& kinds = f->kinds();
      for (std::size_t s = 0; s < kinds.size(); ++s) {
        const auto kind = static_cast<ValueKind>(kinds[s]);
        const auto slot = static_cast<Slot>(s);
        if (kind == ValueKind::kMissing) continue;
        if (kind == ValueKind::kStr && empty_id && f->str_id(slot) == *empty_id) continue;
        if (kind == ValueKind::kStrList && f->list_at(slot).empty()) continue;
        nonempty.set(s);
      }
      if (!v.b) return nonempty;
      Bitmap all = live;
      all.subtract(nonempty);
      return all;
    }
    default:
      return out;
  }
}

Bitmap eval(const FilterNode& n, const MetadataStore& meta, const Bitmap& live) {
  switch (n.type) {
    case FilterNode::Type::kAnd: {
      Bitmap acc = eval(n.children[0], meta, live);
      for (std::size_t i = 1; i < n.children.size(); ++i) acc &= eval(n.children[i], meta, live);
      return acc;
    }
    case FilterNode::Type::kOr: {
      Bitmap acc = eval(n.children[0], meta, live);
      for (std::size_t i = 1; i < n.children.size(); ++i) acc |= eval(n.children[i], meta, live);
      return acc;
    }
    default:
      return eval_cmp(n, meta, live);
  }
}

}  // namespace

FilterOp parse_filter_op(const std::string& name) {
  static const std::pair<const char*, FilterOp> kOps[] = {{"eq", FilterOp::kEq},
                                                          {"ne", FilterOp::kNe},
                                                          {"gt", FilterOp::kGt},
                                                          {"gte", FilterOp::kGte},
                                                          {"lt", FilterOp::kLt},
                                                          {"lte", FilterOp::kLte},
                                                          {"in", FilterOp::kIn},
                                                          {"nin", FilterOp::kNin},
                                                          {"contains", FilterOp::kContains},
                                                          {"not_contains", FilterOp::kNotContains},
                                                          {"starts_with", FilterOp::kStartsWith},
                                                          {"ends_with", FilterOp::kEndsWith},
                                                          {"exists", FilterOp::kExists},
                                                          {"empty", FilterOp::kEmpty},
                                                          {"before", FilterOp::kBefore},
                                                          {"after", FilterOp::kAfter}};
  for (const auto& [n, op] : kOps) {
    if (name == n) return op;
  }
  throw InvalidArgument("unknown filter operator '" + name + "'");
}

void validate_filter(const FilterNode& n) {
  if (n.type != FilterNode::Type::kCmp) {
    if (n.children.empty()) throw InvalidArgument("filter: $and / $or need at least one condition");
    for (const auto& c : n.children) validate_filter(c);
    return;
  }
  if (n.operands.empty()) throw InvalidArgument("filter on '" + n.field + "': missing operand");
  const auto all = [&](auto pred) { return std::all_of(n.operands.begin(), n.operands.end(), pred); };
  const auto is_num = [](const Operand& o) { return o.kind == ValueKind::kInt || o.kind == ValueKind::kFloat; };
  const auto is = [](ValueKind k) { return [k](const Operand& o) { return o.kind == k; }; };
  bool ok = true;
  switch (n.op) {
    case FilterOp::kEq:
    case FilterOp::kNe:
      ok = n.operands.size() == 1;
      break;
    case FilterOp::kGt:
    case FilterOp::kGte:
    case FilterOp::kLt:
    case FilterOp::kLte:
      ok = n.operands.size() == 1 && is_num(n.operands[0]) &&
           (n.operands[0].kind != ValueKind::kFloat || !std::isnan(n.operands[0].f));
      break;
    case FilterOp::kIn:
    case FilterOp::kNin:
      ok = all(is_num) || all(is(ValueKind::kStr)) || all(is(ValueKind::kBool));
      break;
    case FilterOp::kContains:
    case FilterOp::kNotContains:
    case FilterOp::kStartsWith:
    case FilterOp::kEndsWith:
      ok = n.operands.size() == 1 && n.operands[0].kind == ValueKind::kStr;
      break;
    case FilterOp::kExists:
    case FilterOp::kEmpty:
      ok = n.operands.size() == 1 && n.operands[0].kind == ValueKind::kBool;
      break;
    case FilterOp::kBefore:
    case FilterOp::kAfter:
      ok = n.operands.size() == 1 && n.operands[0].kind == ValueKind::kFloat;
      break;
  }
  if (!ok) throw InvalidArgument("filter on '" + n.field + "': operand does not fit the operator");
}

Bitmap evaluate_filter(const FilterNode& node, const MetadataStore& meta, const Bitmap& live) {
  Bitmap out = eval(node, meta, live);
  out &= live;
  return out;
}

void LeafRuns::add(Entries<std::int64_t> e) {
  if (e.empty()) return;
  runs.push_back(IndexRun{e, {}, {}});
  total += e.size();
}

void LeafRuns::add(Entries<double> e) {
  if (e.empty()) return;
  runs.push_back(IndexRun{{}, e, {}});
  total += e.size();
}

void LeafRuns::add(Entries<std::uint32_t> e) {
  if (e.empty()) return;
  runs.push_back(IndexRun{{}, {}, e});
  total += e.size();
}

bool compile_predicate(const FilterNode& n, const MetadataStore& meta, const Bitmap* live, SlotPredicate& out) {
  if (n.type != FilterNode::Type::kCmp || n.operands.size() != 1) return false;
  const Field* f = present_field(n, meta);
  if (f == nullptr) return false;
  const Operand& v = n.operands[0];
  SlotPredicate p;
  p.kinds_ = f->kinds().data();
  p.payload_ = f->payloads().data();
  p.live_ = live;
  const bool number = v.kind == ValueKind::kInt || v.kind == ValueKind::kFloat;
  // The numeric bounds exactly as numeric_range derives them for the index.
  const auto range = [&](const Operand* lo, bool lo_incl, const Operand* hi, bool hi_incl) {
    p.float_lo_ = lo ? double_lower(*lo, lo_incl) : -kInfD;
    p.float_hi_ = hi ? double_upper(*hi, hi_incl) : kInfD;
    p.floats_ = p.float_lo_ <= p.float_hi_;
    IntBounds b;
    if (lo) int_lower(b, *lo, lo_incl);
    if (hi) int_upper(b, *hi, hi_incl);
    p.ints_ = !b.empty && b.lo <= b.hi;
    p.int_lo_ = b.lo;
    p.int_hi_ = b.hi;
  };
  switch (n.op) {
    case FilterOp::kEq:
    case FilterOp::kIn:
      if (number) {
        range(&v, true, &v, true);
      } else if (v.kind == ValueKind::kBool) {
        p.bools_ = true;
        p.bool_value_ = v.b ? 1 : 0;
      } else if (v.kind == ValueKind::kStr) {
        const auto id = meta.dict().find(v.s);
        p.strs_ = id.has_value();  // a string no row holds passes nothing
        p.str_id_ = id ? *id : 0;
      } else {
        return false;
      }
      break;
    case FilterOp::kGt:
      range(&v, false, nullptr, true);
      break;
    case FilterOp::kGte:
      range(&v, true, nullptr, true);
      break;
    case FilterOp::kLt:
      range(nullptr, true, &v, false);
      break;
    case FilterOp::kLte:
      range(nullptr, true, &v, true);
      break;
    default:
      return false;
  }
  out = p;
  return true;
}

const std::vector<Slot>& FilterMatches::ensure_rows() {
  if (has_rows) return rows;
  if (has_bitmap) {
    rows = bitmap.to_slots(count);
  } else {
    rows.clear();
    rows.reserve(count);
    runs.for_each_slot([&](Slot s) {
      if (live == nullptr || live->test(s)) rows.push_back(s);
    });
  }
  has_rows = true;
  return rows;
}

const Bitmap& FilterMatches::ensure_bitmap() {
  if (has_bitmap) return bitmap;
  bitmap = Bitmap(slots);
  if (has_rows) {
    for (Slot s : rows) bitmap.set(s);
  } else {
    set_into(runs, bitmap);
    if (live != nullptr) bitmap &= *live;
  }
  has_bitmap = true;
  return bitmap;
}

FilterMatches match_filter(const FilterNode& node, const MetadataStore& meta, const Bitmap& live,
                           std::size_t rows_up_to, bool all_live, bool allow_predicate) {
  FilterMatches m;
  m.slots = live.size();
  Bitmap bits;
  const Field* f = node.type == FilterNode::Type::kCmp ? present_field(node, meta) : nullptr;
  LeafRuns runs;
  if (f != nullptr && leaf_runs(runs, node, f->index(), meta.dict())) {
    if (runs.total <= rows_up_to) {
      // Few matches: the list comes straight out of the index, O(matches) with no pass over
      // all slots. It is left in index order (ascending within each key): its readers, the
      // exact scans, keep the k best by (distance, slot) whatever the order, and sorting it
      // cost as much as the evaluation itself for selective filters.
      // Every entry is written and the cursor advances only past live ones (no branch);
      // with every slot live, as in an index without deletes, there is nothing to test.
      m.rows.resize(runs.total);
      Slot* out = m.rows.data();
      std::size_t kept = 0;
      if (all_live) {
        runs.for_each_slot([&](Slot s) { out[kept++] = s; });
      } else {
        runs.for_each_slot([&](Slot s) {
          out[kept] = s;
          kept += live.test(s) ? 1 : 0;
        });
      }
      m.rows.resize(kept);
      m.count = kept;
      m.has_rows = true;
      return m;
    }
    const Bitmap* live_or_all = all_live ? nullptr : &live;
    if (allow_predicate && compile_predicate(node, meta, live_or_all, m.predicate)) {
      // Many matches: the count, and a predicate for the walk; no bitmap of them all.
      if (all_live) {
        m.count = runs.total;
      } else {
        std::size_t c = 0;
        runs.for_each_slot([&](Slot s) { c += live.test(s) ? 1 : 0; });
        m.count = c;
      }
      m.runs = std::move(runs);
      m.live = live_or_all;
      m.has_predicate = true;
      if (m.count <= rows_up_to) m.ensure_rows();
      return m;
    }
    bits = Bitmap(live.size());
    set_into(runs, bits);
  } else {
    bits = eval(node, meta, live);
  }
  m.bitmap = std::move(bits);
  m.count = m.bitmap.and_count(live);
  m.has_bitmap = true;
  if (m.count <= rows_up_to) m.ensure_rows();
  return m;
}

}  // namespace kbcore
