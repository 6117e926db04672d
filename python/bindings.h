#pragma once
// Shared declarations of the pybind11 glue. The glue only checks shapes, converts nothing
// (arrays must arrive with the exact dtype and C layout; the Python layer converts once),
// releases the GIL around native work and maps core exceptions to kbcore.errors.
#include <optional>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "filter_expr.h"
#include "metadata_store.h"

namespace py = pybind11;

namespace kbcore::python {

using FloatArray = py::array_t<float, py::array::c_style>;
using IdArray = py::array_t<std::int64_t, py::array::c_style>;

void bind_index(py::module_& m);
/// fast_search(index): the one-query search as a plain CPython function (bind_fast_search.cpp).
void bind_fast_search(py::module_& m);
/// The Filter class: a compiled filter IR converted to a FilterNode once.
void bind_filter(py::module_& m);

/// The compiled filter IR (nested tuples) or a Filter object as a native filter tree.
FilterNode filter_from_py(py::handle ir);
/// A filter argument without a copy: the tree of a Filter object (borrowed: the Python
/// argument keeps it alive for the call, and it is immutable), or one converted from the IR;
/// null for None.
class FilterRef {
 public:
  explicit FilterRef(py::handle filter);
  const FilterNode* get() const { return node_; }

 private:
  std::optional<FilterNode> owned_;
  const FilterNode* node_ = nullptr;
};
/// Typed metadata columns for n rows as borrowed views (the list must outlive their use).
std::vector<ColumnInput> columns_from_py(const py::list& cols, std::size_t n);
/// Stored metadata rows as a list of dicts (fields without a value omitted).
py::list rows_to_py(const std::vector<std::vector<std::pair<std::string, Value>>>& rows);

}  // namespace kbcore::python
