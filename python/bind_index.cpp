// Glue for kbcore::Index: shape checks, output arrays allocated while holding the GIL and
// filled in place with the GIL released.
#include <optional>
#include <string>

#include "bindings.h"
#include "errors.h"
#include "index.h"

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
  if (name == "graph") return Index::Strategy::kGraph;
  if (name == "walk") return Index::Strategy::kWalk;
  throw InvalidArgument("strategy must be 'auto', 'exact', 'graph' or 'walk', got '" + name + "'");
}

const char* strategy_name(Index::Strategy s) {
  switch (s) {
    case Index::Strategy::kExact:
      return "exact";
    case Index::Strategy::kGraph:
      return "graph";
    case Index::Strategy::kWalk:
      return "walk";
    default:
      return "auto";
  }
}

std::size_t ids_len(const IdArray& ids) {
  if (ids.ndim() != 1) throw InvalidArgument("ids must be a 1-D array");
  return static_cast<std::size_t>(ids.shape(0));
}

}  // namespace

void bind_index(py::module_& m) {
  py::class_<Index>(m, "Index")
      .def(py::init([](std::size_t dim, const std::string& metric, const std::string& kind, std::size_t M,
                       std::size_t ef_construction, std::size_t ef, std::uint64_t seed) {
             IndexConfig c;
             c.dim = dim;
             c.metric = parse_metric(metric);
             c.kind = parse_kind(kind);
             c.hnsw.M = M;
             c.hnsw.ef_construction = ef_construction;
             c.hnsw.seed = seed;
             c.ef_search = ef;
             return std::make_unique<Index>(c);
           }),
           py::arg("dim"), py::arg("metric"), py::arg("kind"), py::arg("M"), py::arg("ef_construction"),
           py::arg("ef"), py::arg("seed"))
      .def("add",
           [](Index& self, const FloatArray& vectors, const IdArray& ids, std::size_t threads,
              const py::list& columns, const py::object& texts, bool defer_graph) {
             const std::size_t n = rows_of(vectors, self.dim(), "vectors");
             if (ids_len(ids) != n) {
               throw InvalidArgument("got " + std::to_string(n) + " vectors but " +
                                     std::to_string(ids_len(ids)) + " ids");
             }
             const std::vector<ColumnInput> cols = columns_from_py(columns, n);
             std::optional<std::vector<std::optional<std::string>>> text_rows;
             if (!texts.is_none()) {
               text_rows.emplace();
               text_rows->reserve(n);
               for (py::handle t : texts) {
                 if (t.is_none()) text_rows->emplace_back(std::nullopt);
                 else if (py::isinstance<py::str>(t)) text_rows->emplace_back(t.cast<std::string>());
                 else throw InvalidArgument("texts must be str or None");
               }
             }
             py::gil_scoped_release nogil;
             self.add(vectors.data(), ids.data(), n, threads, cols, text_rows ? &*text_rows : nullptr,
                      defer_graph);
           },
           py::arg("vectors").noconvert(), py::arg("ids").noconvert(), py::arg("threads"),
           py::arg("columns") = py::list(), py::arg("texts") = py::none(), py::arg("defer_graph") = false)
      .def("build_graph",
           [](Index& self, std::size_t max_rows, std::size_t threads) {
             py::gil_scoped_release nogil;
             return self.build_graph(max_rows, threads);
           },
           py::arg("max_rows"), py::arg("threads"))
      .def("pending_rows", &Index::pending_rows)
      .def("search_text",
           [](const Index& self, const std::string& query, std::size_t k, const py::object& filter) {
             const FilterRef node(filter);
             std::vector<std::pair<std::int64_t, float>> res;
             {
               py::gil_scoped_release nogil;
               res = self.search_text(query, k, node.get());
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
           py::arg("query"), py::arg("k"), py::arg("filter") = py::none())
      .def("text_documents", &Index::text_documents)
      .def("remove",
           [](Index& self, const IdArray& ids, std::size_t threads) {
             const std::size_t n = ids_len(ids);
             py::gil_scoped_release nogil;
             self.remove(ids.data(), n, threads);
           },
           py::arg("ids").noconvert(), py::arg("threads"))
      .def("search",
           [](const Index& self, const FloatArray& queries, std::size_t k, std::size_t ef,
              std::size_t threads, const py::object& filter, const std::string& strategy) {
             const std::size_t nq = rows_of(queries, self.dim(), "queries");
             if (k == 0) throw InvalidArgument("k must be positive, got 0");
             const FilterRef node(filter);
             const Index::Strategy force = parse_strategy(strategy);
             IdArray ids({nq, k});
             FloatArray dist({nq, k});
             {
               std::int64_t* pi = ids.mutable_data();
               float* pd = dist.mutable_data();
               py::gil_scoped_release nogil;
               self.search(queries.data(), nq, k, ef, threads, pi, pd, node.get(), force);
             }
             return py::make_tuple(ids, dist);
           },
           py::arg("queries").noconvert(), py::arg("k"), py::arg("ef"), py::arg("threads"),
           py::arg("filter") = py::none(), py::arg("strategy") = "auto")
      .def("search_groups",
           [](const Index& self, const FloatArray& queries, std::size_t k, const std::string& group_by,
              std::size_t group_size, std::size_t ef, std::size_t threads, const py::object& filter,
              const std::string& strategy) {
             const std::size_t nq = rows_of(queries, self.dim(), "queries");
             const FilterRef node(filter);
             const Index::Strategy force = parse_strategy(strategy);
             std::vector<std::vector<Index::GroupHit>> res;
             {
               py::gil_scoped_release nogil;
               res = self.search_groups(queries.data(), nq, k, group_by, group_size, ef, threads,
                                        node.get(), force);
             }
             // Per query: a list of (key, ids, distances, part_ids) tuples of Python scalars;
             // small tuples are far cheaper to build than small numpy arrays.
             py::list out;
             for (const auto& groups : res) {
               py::list gl(groups.size());
               for (std::size_t gi = 0; gi < groups.size(); ++gi) {
                 const auto& g = groups[gi];
                 py::tuple ids(g.ids.size()), dist(g.ids.size()), parts(g.part_ids.size());
                 for (std::size_t j = 0; j < g.ids.size(); ++j) {
                   ids[j] = py::int_(g.ids[j]);
                   dist[j] = py::float_(g.distances[j]);
                 }
                 for (std::size_t j = 0; j < g.part_ids.size(); ++j) parts[j] = py::int_(g.part_ids[j]);
                 py::object key = g.key.kind == ValueKind::kInt ? py::object(py::int_(g.key.i))
                                                                : py::object(py::str(g.key.s));
                 gl[gi] = py::make_tuple(key, ids, dist, parts);
               }
               out.append(gl);
             }
             return out;
           },
           py::arg("queries").noconvert(), py::arg("k"), py::arg("group_by"), py::arg("group_size"),
           py::arg("ef"), py::arg("threads"), py::arg("filter") = py::none(), py::arg("strategy") = "auto")
      .def("count",
           [](const Index& self, const py::object& filter) {
             const FilterRef node(filter);
             if (node.get() == nullptr) throw InvalidArgument("count needs a filter");
             py::gil_scoped_release nogil;
             return self.count(*node.get());
           },
           py::arg("filter"))
      .def("strategy",
           [](const Index& self, std::size_t passing, std::size_t ef) {
             return strategy_name(self.choose_strategy(passing, self.size(), ef));
           },
           py::arg("passing"), py::arg("ef"))
      .def("get_metadata",
           [](const Index& self, const IdArray& ids) {
             const std::size_t n = ids_len(ids);
             std::vector<std::vector<std::pair<std::string, Value>>> rows;
             {
               py::gil_scoped_release nogil;
               rows = self.get_metadata(ids.data(), n);
             }
             py::list out;
             for (const auto& r : rows) out.append(row_to_py(r));
             return out;
           },
           py::arg("ids").noconvert())
      .def("get_vectors",
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
      .def("save",
           [](const Index& self, const std::string& path) {
             py::gil_scoped_release nogil;
             self.save(path);
           },
           py::arg("path"))
      .def_static("load",
                  [](const std::string& path) {
                    py::gil_scoped_release nogil;
                    return Index::load(path);
                  },
                  py::arg("path"))
      .def_property_readonly("evals_per_ef", &Index::evals_per_ef)
      .def_property_readonly("dim", &Index::dim)
      .def_property_readonly("metric", [](const Index& self) { return metric_name(self.config().metric); })
      .def_property_readonly("kind", [](const Index& self) { return kind_name(self.config().kind); })
      .def_property_readonly("M", [](const Index& self) { return self.config().hnsw.M; })
      .def_property_readonly("ef_construction", [](const Index& self) { return self.config().hnsw.ef_construction; })
      .def_property_readonly("seed", [](const Index& self) { return self.config().hnsw.seed; })
      .def_property("ef", &Index::ef_search, &Index::set_ef_search);
}

}  // namespace kbcore::python
