#include "filter_expr.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "errors.h"

namespace kbcore {
namespace {

template <typename K>
void set_range(Bitmap& out, const SortedIndex<K>& idx, K lo, K hi) {
  // All entries with lo <= key <= hi.
  auto first = std::lower_bound(idx.begin(), idx.end(), std::make_pair(lo, Slot{0}));
  for (auto it = first; it != idx.end() && it->first <= hi; ++it) out.set(it->second);
}

template <typename K>
void set_all(Bitmap& out, const SortedIndex<K>& idx) {
  for (const auto& e : idx) out.set(e.second);
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
    if (incl) b.lo = std::max(b.lo, o.i);
    else if (o.i == kMaxI) b.empty = true;
    else b.lo = std::max(b.lo, o.i + 1);
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
    if (incl) b.hi = std::min(b.hi, o.i);
    else if (o.i == kMinI) b.empty = true;
    else b.hi = std::min(b.hi, o.i - 1);
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
void numeric_range(Bitmap& out, const Field& f, const Operand* lo, bool lo_incl, const Operand* hi,
                   bool hi_incl) {
  if (!f.float_index.empty()) {
    const double flo = lo ? double_lower(*lo, lo_incl) : -kInfD;
    const double fhi = hi ? double_upper(*hi, hi_incl) : kInfD;
    if (flo <= fhi) set_range(out, f.float_index, flo, fhi);
  }
  if (!f.int_index.empty()) {
    IntBounds b;
    if (lo) int_lower(b, *lo, lo_incl);
    if (hi) int_upper(b, *hi, hi_incl);
    if (!b.empty && b.lo <= b.hi) set_range(out, f.int_index, b.lo, b.hi);
  }
}

void eq_value(Bitmap& out, const Field& f, const Operand& v, const StringDict& dict) {
  switch (v.kind) {
    case ValueKind::kInt:
    case ValueKind::kFloat:
      numeric_range(out, f, &v, true, &v, true);
      break;
    case ValueKind::kBool: {
      const std::int64_t b = v.b ? 1 : 0;
      set_range(out, f.bool_index, b, b);
      break;
    }
    case ValueKind::kStr:
      if (const auto id = dict.find(v.s)) set_range(out, f.str_index, *id, *id);
      break;
    default:
      break;
  }
}

// Rows whose str value satisfies pred(dictionary id).
template <typename Pred>
void str_where(Bitmap& out, const Field& f, Pred pred) {
  for (const auto& run : f.str_runs) {
    if (!pred(run.first)) continue;
    for (std::size_t i = run.second.first; i < run.second.second; ++i) out.set(f.str_index[i].second);
  }
}

void present(Bitmap& out, const Field& f) {
  for (std::size_t s = 0; s < f.kinds.size(); ++s) {
    if (f.kinds[s] != 0) out.set(s);
  }
}

Bitmap eval_cmp(const FilterNode& n, const MetadataStore& meta, const Bitmap& live) {
  Bitmap out(live.size());
  const Field* f = meta.field(n.field);
  const bool negated = n.op == FilterOp::kNe || n.op == FilterOp::kNin;
  if (f == nullptr || f->present == 0) {
    // No row has the field: negations and "absent" tests pass every live row.
    const bool all = negated || (n.op == FilterOp::kExists && !n.operands[0].b) ||
                     (n.op == FilterOp::kEmpty && n.operands[0].b);
    return all ? live : out;
  }
  f->ensure_index();
  const StringDict& dict = meta.dict();
  const Operand& v = n.operands[0];
  switch (n.op) {
    case FilterOp::kEq:
    case FilterOp::kNe:
      eq_value(out, *f, v, dict);
      break;
    case FilterOp::kIn:
    case FilterOp::kNin:
      for (const Operand& o : n.operands) eq_value(out, *f, o, dict);
      break;
    case FilterOp::kGt:
      numeric_range(out, *f, &v, false, nullptr, true);
      break;
    case FilterOp::kGte:
      numeric_range(out, *f, &v, true, nullptr, true);
      break;
    case FilterOp::kLt:
      numeric_range(out, *f, nullptr, true, &v, false);
      break;
    case FilterOp::kLte:
      numeric_range(out, *f, nullptr, true, &v, true);
      break;
    case FilterOp::kContains:
    case FilterOp::kNotContains: {
      Bitmap hit(live.size());
      str_where(hit, *f, [&](std::uint32_t id) { return dict.str(id).find(v.s) != std::string::npos; });
      if (const auto id = dict.find(v.s)) set_range(hit, f->list_index, *id, *id);
      if (n.op == FilterOp::kContains) return hit;
      // Present as a string or a list, and not containing.
      set_all(out, f->str_index);
      for (std::size_t s = 0; s < f->kinds.size(); ++s) {
        if (f->kinds[s] == static_cast<std::uint8_t>(ValueKind::kStrList)) out.set(s);
      }
      out.subtract(hit);
      break;
    }
    case FilterOp::kStartsWith:
      str_where(out, *f, [&](std::uint32_t id) { return dict.str(id).compare(0, v.s.size(), v.s) == 0; });
      break;
    case FilterOp::kEndsWith:
      str_where(out, *f, [&](std::uint32_t id) {
        const std::string& s = dict.str(id);
        return s.size() >= v.s.size() && s.compare(s.size() - v.s.size(), v.s.size(), v.s) == 0;
      });
      break;
    case FilterOp::kBefore:
      str_where(out, *f, [&](std::uint32_t id) { return dict.instant(id) < v.f; });
      break;
    case FilterOp::kAfter:
      str_where(out, *f, [&](std::uint32_t id) { return dict.instant(id) > v.f; });
      break;
    case FilterOp::kExists:
      present(out, *f);
      if (!v.b) {
        Bitmap all = live;
        all.subtract(out);
        return all;
      }
      break;
    case FilterOp::kEmpty: {
      // Non-empty values: any present value except "" and [].
      Bitmap nonempty(live.size());
      const auto empty_id = dict.find("");
      for (std::size_t s = 0; s < f->kinds.size(); ++s) {
        const auto kind = static_cast<ValueKind>(f->kinds[s]);
        if (kind == ValueKind::kMissing) continue;
        if (kind == ValueKind::kStr && empty_id && static_cast<std::uint32_t>(f->payload[s]) == *empty_id) continue;
        if (kind == ValueKind::kStrList && f->lists[static_cast<std::size_t>(f->payload[s])].empty()) continue;
        nonempty.set(s);
      }
      if (!v.b) return nonempty;
      Bitmap all = live;
      all.subtract(nonempty);
      return all;
    }
  }
  if (negated) {
    Bitmap all = live;
    all.subtract(out);
    return all;
  }
  return out;
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
  static const std::pair<const char*, FilterOp> kOps[] = {
      {"eq", FilterOp::kEq}, {"ne", FilterOp::kNe}, {"gt", FilterOp::kGt}, {"gte", FilterOp::kGte},
      {"lt", FilterOp::kLt}, {"lte", FilterOp::kLte}, {"in", FilterOp::kIn}, {"nin", FilterOp::kNin},
      {"contains", FilterOp::kContains}, {"not_contains", FilterOp::kNotContains},
      {"starts_with", FilterOp::kStartsWith}, {"ends_with", FilterOp::kEndsWith},
      {"exists", FilterOp::kExists}, {"empty", FilterOp::kEmpty}, {"before", FilterOp::kBefore},
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

}  // namespace kbcore
