// The one-query search without pybind11's dispatch: a plain CPython function (METH_FASTCALL)
// bound to one native Index, for the loop of single queries a RAG request runs. pybind11's
// argument loaders, overload dispatch and array casters cost about as much per call as a
// tenth of a small index's search (docs/graph-quality.md, "One query per call"); this entry
// reads the arguments' fields directly and builds the two result arrays through numpy's own
// constructor.
//
// It answers only the plain case: a C-contiguous, aligned, native-order float32 [dim] query,
// an int k and an optional int ef in range, no filter. For anything else, and for any error
// the search raises (a NaN, a zero query under cosine), it returns None and leaves no Python
// error set: the caller (kbcore.Index.search) then takes its checked path, which converts or
// raises the mapped exception. So this entry changes no answer and no error, only the cost.
#include <cstdint>

#include "bindings.h"
#include "index.h"

namespace kbcore::python {
namespace {

constexpr const char* kCapsuleName = "kbcore.FastSearch";

/// What the function is bound to: the native Index and the Python object that owns it (a
/// strong reference, so that the index outlives every call).
struct FastSearch {
  PyObject* owner;
  const Index* index;
};

void release(PyObject* capsule) {
  auto* fs = static_cast<FastSearch*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (fs == nullptr) {
    PyErr_Clear();
    return;
  }
  Py_XDECREF(fs->owner);
  delete fs;
}

/// A positive int of at most MAX_EF (not a bool: PyLong_CheckExact), else 0.
std::size_t bounded(PyObject* v) {
  if (!PyLong_CheckExact(v)) return 0;
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
  if (overflow != 0 || x <= 0 || static_cast<unsigned long long>(x) > kMaxEf) return 0;
  return static_cast<std::size_t>(x);
}

/// An int >= 0 that fits a long long (not a bool), else false: the checked path judges the rest.
bool non_negative(PyObject* v) {
  if (!PyLong_CheckExact(v)) return false;
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
  return overflow == 0 && x >= 0;
}

/// A 1-D float32 [dim] numpy array whose data can be read as it is, else null.
const float* plain_query(PyObject* q, std::size_t dim) {
  const auto& api = py::detail::npy_api::get();
  if (Py_TYPE(q) != api.PyArray_Type_) return nullptr;  // exactly ndarray, no subclass
  const auto* a = py::detail::array_proxy(q);
  if (a->nd != 1 || static_cast<std::size_t>(a->dimensions[0]) != dim) return nullptr;
  constexpr int kWanted = py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_ | py::detail::npy_api::NPY_ARRAY_ALIGNED_;
  if ((a->flags & kWanted) != kWanted) return nullptr;
  const auto* d = py::detail::array_descriptor_proxy(a->descr);
  if (d->type_num != py::detail::npy_api::NPY_FLOAT_ || (d->byteorder != '=' && d->byteorder != '|')) return nullptr;
  return static_cast<const float*>(static_cast<const void*>(a->data));
}

PyObject* new_array(int type_num, std::size_t k) {
  const auto& api = py::detail::npy_api::get();
  Py_intptr_t dims[1] = {static_cast<Py_intptr_t>(k)};
  PyObject* descr = api.PyArray_DescrFromType_(type_num);
  if (descr == nullptr) return nullptr;
  return api.PyArray_NewFromDescr_(api.PyArray_Type_, descr, 1, dims, nullptr, nullptr, 0, nullptr);  // steals descr
}

// search(query, k, ef, threads) -> (ids int64 [k], distances float32 [k]) or None (see above).
// `threads` is checked (an int >= 0) but a single query runs on the calling thread.
PyObject* fast_search(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "fast search takes (query, k, ef, threads)");
    return nullptr;
  }
  const auto* fs = static_cast<const FastSearch*>(PyCapsule_GetPointer(self, kCapsuleName));
  if (fs == nullptr) return nullptr;
  const Index& index = *fs->index;
  const std::size_t k = bounded(args[1]);
  const std::size_t ef = args[2] == Py_None ? std::size_t{0} : bounded(args[2]);
  const bool threads_ok = non_negative(args[3]);
  const float* q = plain_query(args[0], index.dim());
  if (k == 0 || (args[2] != Py_None && ef == 0) || !threads_ok || q == nullptr) Py_RETURN_NONE;
  PyObject* ids = new_array(py::detail::npy_format_descriptor<std::int64_t>::value, k);
  if (ids == nullptr) return nullptr;
  PyObject* dist = new_array(py::detail::npy_api::NPY_FLOAT_, k);
  if (dist == nullptr) {
    Py_DECREF(ids);
    return nullptr;
  }
  auto* pi = static_cast<std::int64_t*>(static_cast<void*>(py::detail::array_proxy(ids)->data));
  auto* pd = static_cast<float*>(static_cast<void*>(py::detail::array_proxy(dist)->data));
  SearchParams params;
  params.k = k;
  params.ef = ef;
  params.threads = 1;
  bool ok = true;
  Py_BEGIN_ALLOW_THREADS;  // the query array stays alive: the caller holds it for the call
  try {
    index.search(q, 1, params, pi, pd);
  } catch (...) {  // NOLINT(bugprone-empty-catch): the checked path raises the mapped error
    ok = false;
  }
  Py_END_ALLOW_THREADS;
  if (!ok) {
    Py_DECREF(ids);
    Py_DECREF(dist);
    Py_RETURN_NONE;
  }
  PyObject* out = PyTuple_New(2);
  if (out == nullptr) {
    Py_DECREF(ids);
    Py_DECREF(dist);
    return nullptr;
  }
  PyTuple_SET_ITEM(out, 0, ids);  // steals
  PyTuple_SET_ITEM(out, 1, dist);
  return out;
}

PyMethodDef fast_search_def = {"fast_search", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_search)),
                               METH_FASTCALL, "One unfiltered query, or None (see kbcore.Index.search)."};

}  // namespace

void bind_fast_search(py::module_& m) {
  m.def(
      "fast_search",
      [](const py::object& native) {
        const Index* index = native.cast<const Index*>();
        auto* fs = new FastSearch{native.ptr(), index};
        Py_INCREF(fs->owner);
        PyObject* capsule = PyCapsule_New(fs, kCapsuleName, release);
        if (capsule == nullptr) {
          Py_DECREF(fs->owner);
          delete fs;
          throw py::error_already_set();
        }
        PyObject* fn = PyCFunction_New(&fast_search_def, capsule);  // holds the capsule
        Py_DECREF(capsule);
        if (fn == nullptr) throw py::error_already_set();
        return py::reinterpret_steal<py::object>(fn);
      },
      py::arg("index"),
      "A plain function fast(query, k, ef, threads) searching `index` for one unfiltered query: "
      "(ids, distances) or None when the arguments need kbcore.Index.search's checked path.");
}

}  // namespace kbcore::python
