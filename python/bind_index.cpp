// Glue for kbcore::Index: shape checks, output arrays allocated while holding the GIL and
// filled in place with the GIL released.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "errors.h"
#include "hybrid_search.h"
#include "index.h"
#include "multi_search.h"
#include "rank_fusion.h"
#include "search_plan_unfiltered.h"

namespace kbcore::python {
namespace {

std::size_t rows_of(const FloatArray& a, std::size_t dim, const char* what) {
  if (a.ndim() != 2) throw InvalidArgument(std::string(what) + " must be a 2-D array [n, dim]");
  if (static_cast<std::size_t>(a.shape(1)) != dim) {
    throw InvalidArgument(std::string(what) + " have dimension " + std::to_string(a.shape(1)) +
                          ", the index has dimension " + std::to_string(dim));
  }
  return static_cast<std::size_t>(a.shape(0));
}

Index::Strategy parse_strategy(const std::string& name) {
  if (name == "auto") return Index::Strategy::kAuto;
  if (name == "exact") return Index::Strategy::kExact;
  if (name == "graph") return Index::Strategy::kTwoHop;
  if (name == "walk") return Index::Strategy::kFilteredWalk;
  throw InvalidArgument("strategy must be 'auto', 'exact', 'graph' or 'walk', got '" + name + "'");
}

const char* strategy_name(Index::Strategy s) {
  switch (s) {
    case Index::Strategy::kExact:
      return "exact";
    case Index::Strategy::kTwoHop:
      return "graph";
    case Index::Strategy::kFilteredWalk:
      return "walk";
    default:
      return "auto";
  }
}

std::size_t ids_len(const IdArray& ids) {
  if (ids.ndim() != 1) throw InvalidArgument("ids must be a 1-D array");
  return static_cast<std::size_t>(ids.shape(0));
}

// Grouped results are built straight from the flat native page: per group one 4-tuple
// (key, ids, distances, part_ids) of Python scalars, created as an instance of `type` (a
// tuple subclass without extra storage, e.g. a NamedTuple) when one is given. Such an
// instance is allocated and filled exactly as tuple.__new__(type, fields) does, without a
// Python-level __new__ call per group; small tuples are far cheaper than small numpy arrays.
PyTypeObject* group_tuple_type(const py::object& group_type) {
  if (group_type.is_none()) return nullptr;
  if (!PyType_Check(group_type.ptr())) throw InvalidArgument("group_type must be a type");
  auto* type = reinterpret_cast<PyTypeObject*>(group_type.ptr());
  if (!PyType_IsSubtype(type, &PyTuple_Type) || type->tp_basicsize != PyTuple_Type.tp_basicsize ||
      type->tp_itemsize != PyTuple_Type.tp_itemsize || type->tp_dictoffset != 0) {
    throw InvalidArgument("group_type must be a tuple subclass without instance attributes (a NamedTuple)");
  }
  return type;
}

py::object steal(PyObject* o) {
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(o);
}

py::object int_tuple(const std::int64_t* v, std::size_t n) {
  py::object t = steal(PyTuple_New(static_cast<Py_ssize_t>(n)));
  for (std::size_t j = 0; j < n; ++j) {
    PyTuple_SET_ITEM(t.ptr(), static_cast<Py_ssize_t>(j), steal(PyLong_FromLongLong(v[j])).release().ptr());
  }
  return t;
}

py::list groups_to_py(const Index::GroupPage& page, PyTypeObject* type) {
  const std::size_t ng = page.size();
  py::list out(ng);
  for (std::size_t g = 0; g < ng; ++g) {
    py::object key;
    if (page.key_kinds[g] == ValueKind::kInt) {
      key = steal(PyLong_FromLongLong(page.key_ints[g]));
    } else {
      const std::size_t b = page.key_str_begin(g);
      key = steal(
          PyUnicode_DecodeUTF8(page.key_chars.data() + b, static_cast<Py_ssize_t>(page.key_str_end[g] - b), "strict"));
    }
    const std::size_t b = page.best_begin(g), n = page.best_end[g] - b;
    py::object ids = int_tuple(page.ids.data() + b, n);
    py::object dist = steal(PyTuple_New(static_cast<Py_ssize_t>(n)));
    for (std::size_t j = 0; j < n; ++j) {
      PyTuple_SET_ITEM(dist.ptr(), static_cast<Py_ssize_t>(j),
                       steal(PyFloat_FromDouble(page.distances[b + j])).release().ptr());
    }
    // Parts met = the best hits (a source met only through its best parts): one shared tuple.
    const std::size_t pb = page.parts_begin(g), np = page.parts_end[g] - pb;
    py::object parts = np == n ? ids : int_tuple(page.part_ids.data() + pb, np);
    py::object grp = steal(type != nullptr ? type->tp_alloc(type, 4) : PyTuple_New(4));
    PyTuple_SET_ITEM(grp.ptr(), 0, key.release().ptr());
    PyTuple_SET_ITEM(grp.ptr(), 1, ids.release().ptr());
    PyTuple_SET_ITEM(grp.ptr(), 2, dist.release().ptr());
    PyTuple_SET_ITEM(grp.ptr(), 3, parts.release().ptr());
    PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(g), grp.release().ptr());
  }
  return out;
}

// Texts given as the buffers of an Arrow string array (Index.add's fast path): (offsets
// int64 [n + 1], UTF-8 bytes uint8, validity uint8 [n] or None); copied row by row without a
// Python str per row. Offsets are checked against the bytes before any is read.
std::vector<std::optional<std::string>> texts_from_buffers(const py::tuple& t, std::size_t n) {
  using ByteArray = py::array_t<std::uint8_t, py::array::c_style>;
  if (t.size() != 3) throw InvalidArgument("texts buffers must be (offsets, data, valid)");
  const auto off = t[0].cast<IdArray>();
  const auto data = t[1].cast<ByteArray>();
  const bool has_valid = !t[2].is_none();
  ByteArray valid;
  if (has_valid) valid = t[2].cast<ByteArray>();
  if (off.ndim() != 1 || static_cast<std::size_t>(off.shape(0)) != n + 1 || data.ndim() != 1 ||
      (has_valid && (valid.ndim() != 1 || static_cast<std::size_t>(valid.shape(0)) != n))) {
    throw InvalidArgument("texts buffers have the wrong shapes for " + std::to_string(n) + " rows");
  }
  const std::int64_t* o = off.data();
  const auto bytes = static_cast<std::int64_t>(data.shape(0));
  for (std::size_t i = 0; i < n; ++i) {
    if (o[i] < 0 || o[i] > o[i + 1] || o[i + 1] > bytes) throw InvalidArgument("texts offsets are out of range");
  }
  const char* d = reinterpret_cast<const char*>(data.data());
  const std::uint8_t* v = has_valid ? valid.data() : nullptr;
  std::vector<std::optional<std::string>> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (v != nullptr && v[i] == 0) {
      out.emplace_back(std::nullopt);
    } else {
      out.emplace_back(std::in_place, d + o[i], static_cast<std::size_t>(o[i + 1] - o[i]));
    }
  }
  return out;
}

// The ranked list of a collapse: ids and values of one length, both 1-D.
std::size_t ranked_len(const IdArray& ids, const FloatArray& values) {
  const std::size_t n = ids_len(ids);
  if (values.ndim() != 1 || static_cast<std::size_t>(values.shape(0)) != n) {
    throw InvalidArgument("values must be a 1-D array as long as ids (" + std::to_string(n) + ")");
  }
  return n;
}

// collapse_keys: groups of positions in the ranked list, as a page of ids and int keys.
Index::GroupPage keyed_page(const GroupedSlots& groups, const std::int64_t* ids, const std::int64_t* keys) {
  Index::GroupPage page;
  const std::size_t ng = groups.size();
  page.key_kinds.assign(ng, ValueKind::kInt);
  page.key_str_end.assign(ng, 0);
  page.key_ints.resize(ng);
  for (std::size_t g = 0; g < ng; ++g) page.key_ints[g] = keys[groups.ordinals[g]];
  page.best_end.assign(groups.best_end.begin(), groups.best_end.end());
  page.parts_end.assign(groups.parts_end.begin(), groups.parts_end.end());
  for (const Scored& s : groups.best) {
    page.ids.push_back(ids[s.slot]);
    page.distances.push_back(s.dist);
  }
  for (const Slot s : groups.parts) page.part_ids.push_back(ids[s]);
  return page;
}

}  // namespace

void bind_index(py::module_& m) {
  m.def(
      "collapse_keys",
      [](const IdArray& ids, const FloatArray& values, const IdArray& keys, std::size_t group_size, std::size_t limit,
         const py::object& group_type) {
        const std::size_t n = ranked_len(ids, values);
        if (ids_len(keys) != n) throw InvalidArgument("keys must be as long as ids (" + std::to_string(n) + ")");
        if (group_size == 0) throw InvalidArgument("group_size must be positive, got 0");
        if (n >= kNoSlot) throw InvalidArgument("a ranked list holds fewer than 2^32 - 1 hits");
        PyTypeObject* type = group_tuple_type(group_type);
        Index::GroupPage page;
        {
          py::gil_scoped_release nogil;
          std::vector<Scored> ranked(n);
          const float* v = values.data();
          for (std::size_t i = 0; i < n; ++i) ranked[i] = Scored{v[i], static_cast<Slot>(i)};
          GroupedSlots groups;
          collapse_keys(ranked, keys.data(), limit, group_size, groups);
          page = keyed_page(groups, ids.data(), keys.data());
        }
        return groups_to_py(page, type);
      },
      py::arg("ids").noconvert(), py::arg("values").noconvert(), py::arg("keys").noconvert(), py::arg("group_size"),
      py::arg("limit"), py::arg("group_type") = py::none(),
      "Collapses a ranked list (best first) by given int64 group keys: the first `limit` groups, each "
      "(key, ids, values, part_ids) with its first group_size hits and every part.");
  m.def(
      "rrf_fuse",
      [](const IdArray& ids_a, const FloatArray& dist_a, const IdArray& ids_b, const FloatArray& score_b, double k) {
        const std::size_t na = ranked_len(ids_a, dist_a), nb = ranked_len(ids_b, score_b);
        std::vector<Fused> fused;
        {
          py::gil_scoped_release nogil;
          fused = rrf_fuse(ids_a.data(), dist_a.data(), na, ids_b.data(), score_b.data(), nb, k);
        }
        IdArray ids(fused.size());
        py::array_t<double> scores(fused.size());
        auto* pi = ids.mutable_data();
        auto* ps = scores.mutable_data();
        for (std::size_t i = 0; i < fused.size(); ++i) {
          pi[i] = fused[i].id;
          ps[i] = fused[i].score;
        }
        return py::make_tuple(ids, scores);
      },
      py::arg("ids_a").noconvert(), py::arg("dist_a").noconvert(), py::arg("ids_b").noconvert(),
      py::arg("score_b").noconvert(), py::arg("k"),
      "Reciprocal rank fusion of a distance leg (ascending) and a score leg (descending): (ids int64, "
      "scores float64), every id once, best first, scores normalised to [0, 1] (rank_fusion.h).");
  py::class_<Index>(m, "Index")
      .def(py::init([](std::size_t dim, const std::string& metric, const std::string& kind, std::size_t M,
                       std::size_t ef_construction, std::size_t ef, std::uint64_t seed, const std::string& quantization,
                       std::size_t rerank, const std::string& vectors, unsigned bits, const py::dict& code_params) {
             IndexConfig c;
             c.dim = dim;
             c.metric = parse_metric(metric);
             c.kind = parse_kind(kind);
             c.hnsw.M = M;
             c.hnsw.ef_construction = ef_construction;
             c.hnsw.seed = seed;
             c.ef_search = ef;
             c.quantization = quantization;
             c.rerank = rerank;
             // The code type's parameters (code_types.h checks them): `bits`, or any by name.
             if (bits != 0) c.code_params.emplace_back("bits", bits);
             for (const auto& [key, value] : code_params) {
               const std::string name = py::str(key);
               if (!py::isinstance<py::str>(key) || !py::isinstance<py::int_>(value) ||
                   py::isinstance<py::bool_>(value)) {
                 throw InvalidArgument("code_params maps parameter names to integers; got " + name + "=" +
                                       std::string(py::str(py::repr(value))));
               }
               try {
                 c.code_params.emplace_back(name, py::cast<std::int64_t>(value));
               } catch (const py::cast_error&) {
                 throw InvalidArgument(name + " is out of range, got " + std::string(py::str(value)));
               }
             }
             if (vectors != "memory" && vectors != "disk") {
               throw InvalidArgument("unknown vectors '" + vectors + "'; expected 'memory' or 'disk'");
             }
             c.vectors_on_disk = vectors == "disk";
             return std::make_unique<Index>(c);
           }),
           py::arg("dim"), py::arg("metric"), py::arg("kind"), py::arg("M"), py::arg("ef_construction"), py::arg("ef"),
           py::arg("seed"), py::arg("quantization") = "none", py::arg("rerank") = 0, py::arg("vectors") = "memory",
           py::arg("bits") = 0, py::arg("code_params") = py::dict())
      .def(
          "add",
          [](Index& self, const FloatArray& vectors, const IdArray& ids, std::size_t threads, const py::list& columns,
             const py::object& texts, bool defer_graph) {
            const std::size_t n = rows_of(vectors, self.dim(), "vectors");
            if (ids_len(ids) != n) {
              throw InvalidArgument("got " + std::to_string(n) + " vectors but " + std::to_string(ids_len(ids)) +
                                    " ids");
            }
            const std::vector<ColumnInput> cols = columns_from_py(columns, n);
            std::optional<std::vector<std::optional<std::string>>> text_rows;
            if (py::isinstance<py::tuple>(texts)) {
              text_rows.emplace(texts_from_buffers(texts.cast<py::tuple>(), n));
            } else if (!texts.is_none()) {
              text_rows.emplace();
              text_rows->reserve(n);
              for (py::handle t : texts) {
                if (t.is_none()) {
                  text_rows->emplace_back(std::nullopt);
                } else if (PyUnicode_Check(t.ptr())) {
                  Py_ssize_t len = 0;
                  const char* utf8 = PyUnicode_AsUTF8AndSize(t.ptr(), &len);
                  if (utf8 == nullptr) {
                    // A lone surrogate has no UTF-8 form: the BM25 leg stores only UTF-8.
                    PyErr_Clear();
                    throw InvalidArgument("texts[" + std::to_string(text_rows->size()) +
                                          "] is not valid Unicode (a lone surrogate has no UTF-8 encoding)");
                  }
                  text_rows->emplace_back(std::in_place, utf8, static_cast<std::size_t>(len));
                } else {
                  // kbcore.errors.InvalidTypeError (a TypeError): the Python layer leaves this check here
                  static const py::handle invalid_type =
                      py::object(py::module_::import("kbcore.errors").attr("InvalidTypeError")).release();
                  const std::string got = py::str(py::type::handle_of(t).attr("__name__"));
                  PyErr_SetString(invalid_type.ptr(), ("texts must be str or None, got " + got).c_str());
                  throw py::error_already_set();
                }
              }
            }
            py::gil_scoped_release nogil;
            self.add(vectors.data(), ids.data(), n, threads, cols, text_rows ? &*text_rows : nullptr, defer_graph);
          },
          py::arg("vectors").noconvert(), py::arg("ids").noconvert(), py::arg("threads"),
          py::arg("columns") = py::list(), py::arg("texts") = py::none(), py::arg("defer_graph") = false)
      .def(
          "build_graph",
          [](Index& self, std::size_t max_rows, std::size_t threads) {
            py::gil_scoped_release nogil;
            return self.build_graph(max_rows, threads);
          },
          py::arg("max_rows"), py::arg("threads"))
      .def("pending_rows", &Index::pending_rows)
      .def(
          "search_text",
          [](const Index& self, const std::string& query, std::size_t k, const py::object& filter,
             const py::object& stats) {
            const FilterRef node(filter);
            std::optional<Bm25Stats> global;
            if (!stats.is_none()) {
              // (documents, total_length, {term: df}): the sum of every shard's text_stats.
              const auto t = stats.cast<py::tuple>();
              if (t.size() != 3) throw InvalidArgument("stats must be (documents, total_length, {term: df})");
              global.emplace();
              global->documents = t[0].cast<std::uint64_t>();
              global->total_length = t[1].cast<std::uint64_t>();
              std::vector<std::pair<std::string, std::uint64_t>> df;
              for (const auto& [term, count] : t[2].cast<py::dict>()) {
                df.emplace_back(term.cast<std::string>(), count.cast<std::uint64_t>());
              }
              std::sort(df.begin(), df.end());
              for (auto& [term, count] : df) {
                global->terms.push_back(std::move(term));
                global->df.push_back(count);
              }
            }
            std::vector<std::pair<std::int64_t, float>> res;
            {
              py::gil_scoped_release nogil;
              res = self.search_text(query, k, node.get(), global ? &*global : nullptr);
            }
            IdArray ids(res.size());
            FloatArray scores(res.size());
            auto* pi = ids.mutable_data();
            auto* ps = scores.mutable_data();
            for (std::size_t i = 0; i < res.size(); ++i) {
              pi[i] = res[i].first;
              ps[i] = res[i].second;
            }
            return py::make_tuple(ids, scores);
          },
          py::arg("query"), py::arg("k"), py::arg("filter") = py::none(), py::arg("stats") = py::none())
      .def(
          "text_stats",
          [](const Index& self, const std::string& query) {
            Bm25Stats st;
            {
              py::gil_scoped_release nogil;
              st = self.text_stats(query);
            }
            py::dict df;
            for (std::size_t i = 0; i < st.terms.size(); ++i) df[py::str(st.terms[i])] = st.df[i];
            return py::make_tuple(st.documents, st.total_length, df);
          },
          py::arg("query"))
      .def("text_documents", &Index::text_documents)
      .def(
          "remove",
          [](Index& self, const IdArray& ids, std::size_t threads) {
            const std::size_t n = ids_len(ids);
            py::gil_scoped_release nogil;
            self.remove(ids.data(), n, threads);
          },
          py::arg("ids").noconvert(), py::arg("threads"))
      .def(
          "search",
          [](const Index& self, const FloatArray& queries, std::size_t k, std::size_t ef, std::size_t threads,
             const py::object& filter, const std::string& strategy) {
            const std::size_t nq = rows_of(queries, self.dim(), "queries");
            if (k == 0) throw InvalidArgument("k must be positive, got 0");
            check_max_ef("k", k);  // before the [nq, k] results are allocated
            const FilterRef node(filter);
            SearchParams params;
            params.k = k;
            params.ef = ef;
            params.threads = threads;
            params.filter = node.get();
            params.force = parse_strategy(strategy);
            IdArray ids({nq, k});
            FloatArray dist({nq, k});
            {
              std::int64_t* pi = ids.mutable_data();
              float* pd = dist.mutable_data();
              py::gil_scoped_release nogil;
              self.search(queries.data(), nq, params, pi, pd);
            }
            return py::make_tuple(ids, dist);
          },
          py::arg("queries").noconvert(), py::arg("k"), py::arg("ef"), py::arg("threads"),
          py::arg("filter") = py::none(), py::arg("strategy") = "auto")
      .def(
          "search_one",
          // One query, [dim] (converted if it is not C-contiguous float32): the loop of single
          // queries a RAG request runs, without the batch call's 2-D views, keyword arguments
          // and strategy string. Returns 1-D (ids [k], distances [k]).
          [](const Index& self, const FloatArray& query, std::size_t k, std::size_t ef, const py::object& filter) {
            if (query.ndim() != 1 || static_cast<std::size_t>(query.shape(0)) != self.dim()) {
              throw InvalidArgument("query must be a 1-D array of the index's dimension " + std::to_string(self.dim()));
            }
            if (k == 0) throw InvalidArgument("k must be positive, got 0");
            check_max_ef("k", k);  // before the [nq, k] results are allocated
            const FilterRef node(filter);
            SearchParams params;
            params.k = k;
            params.ef = ef;
            params.threads = 1;
            params.filter = node.get();
            IdArray ids(static_cast<py::ssize_t>(k));
            FloatArray dist(static_cast<py::ssize_t>(k));
            {
              std::int64_t* pi = ids.mutable_data();
              float* pd = dist.mutable_data();
              py::gil_scoped_release nogil;
              self.search(query.data(), 1, params, pi, pd);
            }
            return py::make_tuple(ids, dist);
          },
          py::arg("query"), py::arg("k"), py::arg("ef"), py::arg("filter"))
      .def(
          "search_hybrid_legs",
          // Both legs of one hybrid query, concurrently (hybrid_search.h), unfused: (ids [k],
          // distances [k], text ids, text scores) as search_one and search_text return them.
          [](const Index& self, const FloatArray& query, const std::string& text, std::size_t k, std::size_t ef,
             const py::object& filter) {
            if (query.ndim() != 1 || static_cast<std::size_t>(query.shape(0)) != self.dim()) {
              throw InvalidArgument("query must be a 1-D array of the index's dimension " + std::to_string(self.dim()));
            }
            const FilterRef node(filter);
            HybridLegs legs;
            {
              py::gil_scoped_release nogil;
              std::shared_ptr<ThreadPool> pool = search_pool();
              legs = search_hybrid_legs(self, query.data(), text, k, ef, node.get(), *pool);
            }
            IdArray ids(static_cast<py::ssize_t>(legs.ids.size()), legs.ids.data());
            FloatArray dist(static_cast<py::ssize_t>(legs.distances.size()), legs.distances.data());
            IdArray tids(static_cast<py::ssize_t>(legs.text_ids.size()), legs.text_ids.data());
            FloatArray tscores(static_cast<py::ssize_t>(legs.text_scores.size()), legs.text_scores.data());
            return py::make_tuple(ids, dist, tids, tscores);
          },
          py::arg("query"), py::arg("text"), py::arg("k"), py::arg("ef"), py::arg("filter"))
      .def(
          "search_hybrid_rrf",
          // Both legs of one hybrid query, concurrently, fused by RRF (hybrid_search.h): one
          // GIL release instead of three calls. Returns (ids int64, scores float64, vector
          // hits, text hits).
          [](const Index& self, const FloatArray& query, const std::string& text, std::size_t k, std::size_t ef,
             const py::object& filter, double rrf_k) {
            if (query.ndim() != 1 || static_cast<std::size_t>(query.shape(0)) != self.dim()) {
              throw InvalidArgument("query must be a 1-D array of the index's dimension " + std::to_string(self.dim()));
            }
            const FilterRef node(filter);
            HybridRrf res;
            {
              py::gil_scoped_release nogil;
              std::shared_ptr<ThreadPool> pool = search_pool();
              res = search_hybrid_rrf(self, query.data(), text, k, ef, node.get(), rrf_k, *pool);
            }
            IdArray ids(static_cast<py::ssize_t>(res.fused.size()));
            py::array_t<double> scores(static_cast<py::ssize_t>(res.fused.size()));
            auto* pi = ids.mutable_data();
            auto* ps = scores.mutable_data();
            for (std::size_t i = 0; i < res.fused.size(); ++i) {
              pi[i] = res.fused[i].id;
              ps[i] = res.fused[i].score;
            }
            return py::make_tuple(ids, scores, res.vector_hits, res.text_hits);
          },
          py::arg("query"), py::arg("text"), py::arg("k"), py::arg("ef"), py::arg("filter"), py::arg("rrf_k"))
      .def(
          "search_groups",
          [](const Index& self, const FloatArray& queries, std::size_t k, const std::string& group_by,
             std::size_t group_size, std::size_t ef, std::size_t threads, const py::object& filter,
             const std::string& strategy, const py::object& group_type) {
            const std::size_t nq = rows_of(queries, self.dim(), "queries");
            const FilterRef node(filter);
            GroupParams params;
            params.k = k;
            params.ef = ef;
            params.threads = threads;
            params.filter = node.get();
            params.force = parse_strategy(strategy);
            params.group_by = group_by;
            params.group_size = group_size;
            PyTypeObject* type = group_tuple_type(group_type);
            std::vector<Index::GroupPage> pages;
            {
              py::gil_scoped_release nogil;
              pages = self.search_groups(queries.data(), nq, params);
            }
            py::list out(nq);
            for (std::size_t qi = 0; qi < nq; ++qi) {
              py::list groups = groups_to_py(pages[qi], type);
              PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(qi), groups.release().ptr());
            }
            return out;
          },
          py::arg("queries").noconvert(), py::arg("k"), py::arg("group_by"), py::arg("group_size"), py::arg("ef"),
          py::arg("threads"), py::arg("filter") = py::none(), py::arg("strategy") = "auto",
          py::arg("group_type") = py::none())
      .def(
          "collapse",
          [](const Index& self, const IdArray& ids, const FloatArray& values, const std::string& group_by,
             std::size_t group_size, std::size_t limit, const py::object& group_type) {
            const std::size_t n = ranked_len(ids, values);
            PyTypeObject* type = group_tuple_type(group_type);
            Index::GroupPage page;
            {
              py::gil_scoped_release nogil;
              page = self.collapse(ids.data(), values.data(), n, group_by, group_size, limit);
            }
            return groups_to_py(page, type);
          },
          py::arg("ids").noconvert(), py::arg("values").noconvert(), py::arg("group_by"), py::arg("group_size"),
          py::arg("limit"), py::arg("group_type") = py::none())
      .def(
          "count",
          [](const Index& self, const py::object& filter) {
            const FilterRef node(filter);
            if (node.get() == nullptr) throw InvalidArgument("count needs a filter");
            py::gil_scoped_release nogil;
            return self.count(*node.get());
          },
          py::arg("filter"))
      .def(
          "strategy",
          [](const Index& self, std::size_t passing, std::size_t ef) {
            return strategy_name(self.choose_strategy(passing, self.size(), ef));
          },
          py::arg("passing"), py::arg("ef"))
      .def(
          "unfiltered_strategy",
          // The plan of an unfiltered search at this ef (max(ef, k)) now: "exact" (the scan of
          // every row) or "graph" (the walk); search_plan_unfiltered.h.
          [](const Index& self, std::size_t ef) {
            const std::size_t n = self.size();
            const std::size_t e = std::min(ef == 0 ? self.config().ef_search : ef, n);
            const bool scan = self.config().kind != IndexKind::kHnsw || scan_beats_walk(n, e, kPlanEvalsPerEf);
            return scan ? "exact" : "graph";
          },
          py::arg("ef"))
      .def(
          "get_metadata",
          [](const Index& self, const IdArray& ids) {
            const std::size_t n = ids_len(ids);
            std::vector<std::vector<std::pair<std::string, Value>>> rows;
            {
              py::gil_scoped_release nogil;
              rows = self.get_metadata(ids.data(), n);
            }
            return rows_to_py(rows);
          },
          py::arg("ids").noconvert())
      .def(
          "get_vectors",
          [](const Index& self, const IdArray& ids) {
            const std::size_t n = ids_len(ids);
            FloatArray out({n, self.dim()});
            float* p = out.mutable_data();
            py::gil_scoped_release nogil;
            self.get_vectors(ids.data(), n, p);
            return out;
          },
          py::arg("ids").noconvert())
      .def("ids",
           [](const Index& self) {
             std::vector<std::int64_t> v = self.ids();
             IdArray out(v.size());
             std::copy(v.begin(), v.end(), out.mutable_data());
             return out;
           })
      .def("contains", &Index::contains, py::arg("id"))
      .def("size", &Index::size)
      .def("memory_bytes", &Index::memory_bytes)
      .def_property_readonly("_codes_in_place", &Index::codes_in_place)
      .def_property_readonly("_links_in_place", &Index::links_in_place)
      .def(
          "save",
          [](const Index& self, const std::string& path) {
            py::gil_scoped_release nogil;
            self.save(path);
          },
          py::arg("path"))
      .def_static(
          "load",
          [](const std::string& path, std::optional<std::string> vectors, bool mmap) {
            // None: where the rows lived when the index was saved.
            if (vectors && *vectors != "memory" && *vectors != "disk") {
              throw InvalidArgument("unknown vectors '" + *vectors + "'; expected 'memory', 'disk' or None");
            }
            const std::optional<bool> on_disk = vectors ? std::optional<bool>(*vectors == "disk") : std::nullopt;
            py::gil_scoped_release nogil;
            return Index::load(path, on_disk, mmap);
          },
          py::arg("path"), py::arg("vectors") = py::none(), py::arg("mmap") = true)
      .def_property_readonly("vectors",
                             [](const Index& self) { return self.config().vectors_on_disk ? "disk" : "memory"; })
      .def_property_readonly("evals_per_ef", &Index::evals_per_ef)
      .def(
          "search_stats",
          // Debug statistics of the unfiltered graph walk (Index::search_stats): per query,
          // uint64 [nq] arrays of level-0 hops, upper-level hops and distances scored.
          [](const Index& self, const FloatArray& queries, std::size_t k, std::size_t ef) {
            const std::size_t nq = rows_of(queries, self.dim(), "queries");
            using CountArray = py::array_t<std::uint64_t, py::array::c_style>;
            CountArray hops(static_cast<py::ssize_t>(nq));
            CountArray upper(static_cast<py::ssize_t>(nq));
            CountArray scored(static_cast<py::ssize_t>(nq));
            {
              std::uint64_t* ph = hops.mutable_data();
              std::uint64_t* pu = upper.mutable_data();
              std::uint64_t* ps = scored.mutable_data();
              py::gil_scoped_release nogil;
              self.search_stats(queries.data(), nq, k, ef, ph, pu, ps);
            }
            return py::make_tuple(hops, upper, scored);
          },
          py::arg("queries").noconvert(), py::arg("k"), py::arg("ef"))
      .def_property_readonly("quantization", [](const Index& self) { return self.config().quantization; })
      .def_property(
          "rerank", [](const Index& self) { return self.config().rerank; }, &Index::set_rerank)
      .def_property_readonly("bits", [](const Index& self) { return code_param(self.config().code_params, "bits", 0); })
      .def_property_readonly(
          "code_params",
          [](const Index& self) {
            py::dict out;
            for (const auto& [name, value] : self.config().code_params) out[py::str(name)] = value;
            return out;
          },
          "The code type's parameters by name (empty without quantization).")
      .def_property_readonly("quantizer_trained", &Index::quantizer_trained)
      .def(
          "reorder",
          [](Index& self, const std::string& method, std::size_t threads) {
            py::gil_scoped_release nogil;
            self.reorder(method, threads);
          },
          py::arg("method"), py::arg("threads"))
      .def(
          "retrain_quantizer",
          [](Index& self, std::size_t threads) {
            py::gil_scoped_release nogil;
            self.retrain_quantizer(threads);
          },
          py::arg("threads"))
      .def_property_readonly("dim", &Index::dim)
      .def_property_readonly("metric", [](const Index& self) { return metric_name(self.config().metric); })
      .def_property_readonly("kind", [](const Index& self) { return kind_name(self.config().kind); })
      .def_property_readonly("M", [](const Index& self) { return self.config().hnsw.M; })
      .def_property_readonly("ef_construction", [](const Index& self) { return self.config().hnsw.ef_construction; })
      .def_property_readonly("seed", [](const Index& self) { return self.config().hnsw.seed; })
      .def_property("ef", &Index::ef_search, &Index::set_ef_search);

  m.def(
      "search_many",
      // One query per index, the searches run concurrently on the search pool with the GIL
      // released. Each request is (index, query [dim] float32, k, ef, filter, group_by or None,
      // group_size); each result is (ids [k], distances [k]) or, grouped, a list of groups.
      [](const py::list& requests, std::size_t threads, const py::object& group_type) {
        PyTypeObject* type = group_tuple_type(group_type);
        const std::size_t n = requests.size();
        std::vector<py::object> keep;  // the indexes and queries stay alive without the GIL
        keep.reserve(2 * n);
        std::vector<std::unique_ptr<FilterRef>> filters;
        filters.reserve(n);
        std::vector<SearchTask> tasks(n);
        for (std::size_t i = 0; i < n; ++i) {
          py::handle h = requests[i];
          if (!py::isinstance<py::tuple>(h) || py::len(h) != 7) {
            throw InvalidArgument("a search request is (index, query, k, ef, filter, group_by, group_size)");
          }
          auto t = py::reinterpret_borrow<py::tuple>(h);
          const Index& index = t[0].cast<const Index&>();
          auto query = t[1].cast<FloatArray>();  // copies a query that is not C-contiguous float32
          if (query.ndim() != 1 || static_cast<std::size_t>(query.shape(0)) != index.dim()) {
            throw InvalidArgument("request " + std::to_string(i) + ": the query must be a 1-D array of the index's " +
                                  "dimension " + std::to_string(index.dim()));
          }
          SearchTask& task = tasks[i];
          task.index = &index;
          task.query = query.data();
          task.params.k = t[2].cast<std::size_t>();
          if (task.params.k == 0) throw InvalidArgument("k must be positive, got 0");
          check_max_ef("k", task.params.k);  // before the results are sized
          task.params.ef = t[3].cast<std::size_t>();
          filters.push_back(std::make_unique<FilterRef>(t[4]));
          task.params.filter = filters.back()->get();
          if (!t[5].is_none()) {
            task.params.group_by = t[5].cast<std::string>();
            if (task.params.group_by.empty()) throw InvalidArgument("group_by must be a non-empty field name");
            task.params.group_size = t[6].cast<std::size_t>();
          }
          keep.emplace_back(py::reinterpret_borrow<py::object>(t[0]));
          keep.emplace_back(std::move(query));
        }
        {
          py::gil_scoped_release nogil;
          std::shared_ptr<ThreadPool> pool = search_pool();
          search_many(tasks, *pool, threads);
        }
        py::list out(n);
        for (std::size_t i = 0; i < n; ++i) {
          SearchTask& task = tasks[i];
          py::object result;
          if (task.params.group_by.empty()) {
            const auto k = static_cast<py::ssize_t>(task.params.k);
            IdArray ids(k);
            FloatArray dist(k);
            std::copy(task.ids.begin(), task.ids.end(), ids.mutable_data());
            std::copy(task.distances.begin(), task.distances.end(), dist.mutable_data());
            result = py::make_tuple(ids, dist);
          } else {
            result = groups_to_py(task.page, type);
          }
          PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), result.release().ptr());
        }
        return out;
      },
      py::arg("requests"), py::arg("threads") = 0, py::arg("group_type") = py::none(),
      "One query per index, searched concurrently on the search pool (the GIL released) by at most "
      "`threads` threads (0: the pool's size).");
  m.def("set_search_threads", &set_search_threads, py::arg("threads"),
        "Threads (the caller included) working on one search_many call: 1 = serial, 0 = the default.");
  m.def("wake_search_pool", &wake_search_pool, py::arg("tasks"),
        "Wakes the search pool's workers a search_many call of `tasks` searches will use (a hint).");
  m.def("search_threads", &search_threads, "Threads (the caller included) working on one search_many call.");
}

}  // namespace kbcore::python
