// Glue for filters and metadata: the compiled filter IR (nested tuples, see
// docs/filter-ir.md) becomes a FilterNode; typed metadata columns become borrowed
// ColumnInput views; stored metadata rows become dicts.
#include <memory>
#include <string>

#include "bindings.h"
#include "errors.h"
#include "string_dict.h"

namespace kbcore::python {
namespace {

Operand operand_from_py(py::handle v) {
  Operand o;
  // bool first: in Python a bool is also an int.
  if (py::isinstance<py::bool_>(v)) {
    o.kind = ValueKind::kBool;
    o.b = v.cast<bool>();
  } else if (py::isinstance<py::int_>(v)) {
    o.kind = ValueKind::kInt;
    try {
      o.i = v.cast<std::int64_t>();
    } catch (const py::cast_error&) {
      throw InvalidArgument("filter operand does not fit in int64");
    }
  } else if (py::isinstance<py::float_>(v)) {
    o.kind = ValueKind::kFloat;
    o.f = v.cast<double>();
  } else if (py::isinstance<py::str>(v)) {
    o.kind = ValueKind::kStr;
    o.s = v.cast<std::string>();
  } else {
    throw InvalidArgument("filter operand must be int, float, bool or str");
  }
  return o;
}

template <typename T>
const T* typed(py::handle h, std::size_t n, const char* what, const std::string& field) {
  using A = py::array_t<T, py::array::c_style>;
  if (!py::isinstance<A>(h)) {
    throw InvalidArgument("metadata column '" + field + "': " + what + " must be a C-contiguous array of " +
                          py::str(py::dtype::of<T>()).cast<std::string>());
  }
  auto a = py::reinterpret_borrow<A>(h);
  if (a.ndim() != 1 || static_cast<std::size_t>(a.shape(0)) != n) {
    throw InvalidArgument("metadata column '" + field + "': " + what + " must have length " + std::to_string(n));
  }
  return a.data();
}

std::size_t length_of(py::handle h) { return static_cast<std::size_t>(py::len(h)); }

}  // namespace

namespace {
// A filter tree converted from the IR and validated once; the Python layer caches these
// next to the IR so that a repeated `where` costs neither conversion nor validation.
struct CompiledFilter {
  FilterNode node;
};

// The CompiledFilter of a Filter object (or of an instance of a subclass); null for any other
// object. Its registered type is looked up once per process, not per call (pybind11's
// isinstance + cast were a visible part of every filtered search). An instance made by
// Filter.__new__ alone holds no filter: that raises instead of reading a missing one.
const CompiledFilter* compiled_of(py::handle h) {
  static const py::detail::type_info* const type = py::detail::get_type_info(typeid(CompiledFilter));
  if (type == nullptr) return nullptr;
  if (Py_TYPE(h.ptr()) != type->type && !PyObject_TypeCheck(h.ptr(), type->type)) return nullptr;
  auto* inst = reinterpret_cast<py::detail::instance*>(h.ptr());
  const py::detail::value_and_holder vh = inst->get_value_and_holder(type, /*throw_if_missing=*/false);
  if (vh.inst == nullptr || vh.vh == nullptr || !vh.holder_constructed() || vh.value_ptr() == nullptr) {
    throw InvalidArgument("filter: this Filter object was never initialised (construct it with Filter(ir))");
  }
  return static_cast<const CompiledFilter*>(vh.value_ptr());
}
}  // namespace

FilterNode filter_from_py(py::handle ir) {
  if (const CompiledFilter* f = compiled_of(ir)) return f->node;
  if (!py::isinstance<py::tuple>(ir) || py::len(ir) < 2) throw InvalidArgument("malformed compiled filter");
  auto t = py::reinterpret_borrow<py::tuple>(ir);
  const std::string type = t[0].cast<std::string>();
  FilterNode n;
  if (type == "and" || type == "or") {
    n.type = type == "and" ? FilterNode::Type::kAnd : FilterNode::Type::kOr;
    for (py::handle c : t[1]) n.children.push_back(filter_from_py(c));
    return n;
  }
  if (type != "cmp" || py::len(t) != 4) throw InvalidArgument("malformed compiled filter");
  n.type = FilterNode::Type::kCmp;
  n.field = t[1].cast<std::string>();
  n.op = parse_filter_op(t[2].cast<std::string>());
  py::handle v = t[3];
  if (py::isinstance<py::tuple>(v) || py::isinstance<py::list>(v)) {
    for (py::handle x : v) n.operands.push_back(operand_from_py(x));
  } else {
    n.operands.push_back(operand_from_py(v));
  }
  return n;
}

namespace {

// The cache key of a where of one of the one-condition shapes {field: {op: v}} and
// {field: v} with a str / int / float / bool v: (field, op, type(v), v) or (field, type(v), v),
// a new reference; None (a new reference too) for any other where. The type keeps 1, 1.0 and
// True apart (they hash alike). Built in C for both sides of kbcore.filters' cache (storing
// and looking up), so that a hit costs one C call: pybind11's dispatch alone cost more than
// the lookup (figures in the commit message and benches/README.md).
bool plain_scalar(PyObject* v) {
  PyTypeObject* t = Py_TYPE(v);
  return t == &PyUnicode_Type || t == &PyLong_Type || t == &PyFloat_Type || t == &PyBool_Type;
}

PyObject* quick_key(PyObject*, PyObject* where) {
  if (!PyDict_CheckExact(where) || PyDict_GET_SIZE(where) != 1) Py_RETURN_NONE;
  Py_ssize_t pos = 0;
  PyObject* field = nullptr;
  PyObject* spec = nullptr;
  PyDict_Next(where, &pos, &field, &spec);  // borrowed references
  if (!PyUnicode_CheckExact(field)) Py_RETURN_NONE;
  if (PyDict_CheckExact(spec)) {
    if (PyDict_GET_SIZE(spec) != 1) Py_RETURN_NONE;
    pos = 0;
    PyObject* op = nullptr;
    PyObject* v = nullptr;
    PyDict_Next(spec, &pos, &op, &v);
    if (!PyUnicode_CheckExact(op) || !plain_scalar(v)) Py_RETURN_NONE;
    return PyTuple_Pack(4, field, op, reinterpret_cast<PyObject*>(Py_TYPE(v)), v);
  }
  if (plain_scalar(spec)) return PyTuple_Pack(3, field, reinterpret_cast<PyObject*>(Py_TYPE(spec)), spec);
  Py_RETURN_NONE;
}

// cached_filter(cache, where): cache[quick_key(where)][1] (the native Filter of a cached
// (IR, Filter) entry), else None.
PyObject* cached_filter(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyDict_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "cached_filter(cache: dict, where) takes two arguments");
    return nullptr;
  }
  PyObject* key = quick_key(nullptr, args[1]);
  if (key == nullptr) return nullptr;
  if (key == Py_None) return key;
  PyObject* hit = PyDict_GetItemWithError(args[0], key);  // borrowed
  Py_DECREF(key);
  if (hit == nullptr) {
    if (PyErr_Occurred()) return nullptr;
    Py_RETURN_NONE;
  }
  if (!PyTuple_Check(hit) || PyTuple_GET_SIZE(hit) != 2) Py_RETURN_NONE;
  PyObject* filter = PyTuple_GET_ITEM(hit, 1);
  Py_INCREF(filter);
  return filter;
}

PyMethodDef kQuickKeyDef = {"quick_key", &quick_key, METH_O,
                            "quick_key(where): the filter-cache key of a one-condition where, else None."};
PyMethodDef kCachedFilterDef = {
    "cached_filter", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&cached_filter)), METH_FASTCALL,
    "cached_filter(cache, where): the cached native Filter of a one-condition where, else None."};

}  // namespace

void bind_filter(py::module_& m) {
  for (PyMethodDef* def : {&kQuickKeyDef, &kCachedFilterDef}) {
    m.add_object(def->ml_name,
                 py::reinterpret_steal<py::object>(PyCFunction_NewEx(def, nullptr, m.attr("__name__").ptr())));
  }
  py::class_<CompiledFilter, std::shared_ptr<CompiledFilter>>(
      m, "Filter", "A compiled filter (IR of docs/filter-ir.md) converted and validated once.")
      .def(py::init([](const py::tuple& ir) {
             auto f = std::make_shared<CompiledFilter>();
             f->node = filter_from_py(ir);
             validate_filter(f->node);
             return f;
           }),
           py::arg("ir"));
  // The one ISO-8601 parser (cpp/string_dict.cpp): the engine compares stored strings with it,
  // so the operands of $before / $after go through it too and equal spellings compare equal.
  m.def(
      "parse_iso8601",
      [](const std::string& text) -> py::object {
        const std::optional<double> t = parse_iso8601(text);
        if (!t) return py::none();
        return py::float_(*t);
      },
      py::arg("text"), "parse_iso8601(text): epoch seconds (UTC) of an ISO-8601 string, else None.");
}

FilterRef::FilterRef(py::handle filter) {
  if (filter.is_none()) return;
  if (const CompiledFilter* f = compiled_of(filter)) {
    node_ = &f->node;
    return;
  }
  owned_ = filter_from_py(filter);
  node_ = &*owned_;
}

std::vector<ColumnInput> columns_from_py(const py::list& cols, std::size_t n) {
  std::vector<ColumnInput> out;
  for (py::handle h : cols) {
    if (!py::isinstance<py::tuple>(h) || py::len(h) < 4) throw InvalidArgument("malformed metadata column");
    auto t = py::reinterpret_borrow<py::tuple>(h);
    ColumnInput c;
    c.name = t[0].cast<std::string>();
    const std::string kind = t[1].cast<std::string>();
    c.valid = typed<std::uint8_t>(t[2], n, "validity", c.name);
    if (kind == "int") {
      c.kind = ValueKind::kInt;
      c.ints = typed<std::int64_t>(t[3], n, "values", c.name);
    } else if (kind == "float") {
      c.kind = ValueKind::kFloat;
      c.floats = typed<double>(t[3], n, "values", c.name);
    } else if (kind == "bool") {
      c.kind = ValueKind::kBool;
      c.bools = typed<std::uint8_t>(t[3], n, "values", c.name);
    } else if (kind == "str" && py::len(t) == 5) {
      c.kind = ValueKind::kStr;
      c.offsets = typed<std::int64_t>(t[3], n + 1, "offsets", c.name);
      c.data_len = length_of(t[4]);
      c.data = typed<std::uint8_t>(t[4], c.data_len, "data", c.name);
    } else if (kind == "strlist" && py::len(t) == 6) {
      c.kind = ValueKind::kStrList;
      c.list_offsets = typed<std::int64_t>(t[3], n + 1, "list offsets", c.name);
      c.n_strings = length_of(t[4]) == 0 ? 0 : length_of(t[4]) - 1;
      c.offsets = typed<std::int64_t>(t[4], c.n_strings + 1, "offsets", c.name);
      c.data_len = length_of(t[5]);
      c.data = typed<std::uint8_t>(t[5], c.data_len, "data", c.name);
    } else {
      throw InvalidArgument("metadata column '" + c.name + "': unknown kind '" + kind + "'");
    }
    out.push_back(std::move(c));
  }
  return out;
}

namespace {

py::object steal_ref(PyObject* o) {
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(o);
}

py::object str_of(const std::string& s) {
  return steal_ref(PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "strict"));
}

py::object value_to_py(const Value& v) {
  switch (v.kind) {
    case ValueKind::kInt:
      return steal_ref(PyLong_FromLongLong(v.i));
    case ValueKind::kFloat:
      return steal_ref(PyFloat_FromDouble(v.f));
    case ValueKind::kBool:
      return py::bool_(v.b);
    case ValueKind::kStr:
      return str_of(v.s);
    case ValueKind::kStrList: {
      py::object l = steal_ref(PyList_New(static_cast<Py_ssize_t>(v.list.size())));
      for (std::size_t j = 0; j < v.list.size(); ++j) {
        PyList_SET_ITEM(l.ptr(), static_cast<Py_ssize_t>(j), str_of(v.list[j]).release().ptr());
      }
      return l;
    }
    default:
      return py::object();
  }
}

}  // namespace

py::list rows_to_py(const std::vector<std::vector<std::pair<std::string, Value>>>& rows) {
  // Rows list their fields in one (sorted) order, so the key objects of the previous row are
  // reused when the names repeat: a key str is decoded and hashed once per call, not per row.
  std::vector<std::pair<const std::string*, py::object>> keys;
  py::list out(rows.size());
  for (std::size_t r = 0; r < rows.size(); ++r) {
    py::object d = steal_ref(PyDict_New());
    std::size_t j = 0;
    for (const auto& [name, v] : rows[r]) {
      py::object o = value_to_py(v);
      if (!o) continue;
      if (j == keys.size()) {
        keys.emplace_back(&name, str_of(name));
      } else if (*keys[j].first != name) {
        keys[j] = {&name, str_of(name)};
      }
      if (PyDict_SetItem(d.ptr(), keys[j].second.ptr(), o.ptr()) != 0) throw py::error_already_set();
      ++j;
    }
    PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(r), d.release().ptr());
  }
  return out;
}

}  // namespace kbcore::python
