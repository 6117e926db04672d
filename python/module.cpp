// Module entry point: exception translation and SIMD controls.
#include <string>
#include <vector>

#include "aligned.h"
#include "binary_io.h"
#include "bindings.h"
#include "code_types.h"
#include "distance.h"
#include "errors.h"
#include "graph_search.h"
#include "hnsw_index.h"
#include "index.h"
#include "tokenizer.h"

namespace kbcore::python {
namespace {

void register_errors(py::module_& m) {
  // The classes live in kbcore/errors.py so that they are plain Python classes that
  // subclass both KbcoreError and the matching builtin.
  py::module_ errors = py::module_::import("kbcore.errors");
  static py::object invalid = errors.attr("InvalidArgumentError");
  static py::object not_found = errors.attr("NotFoundError");
  static py::object format = errors.attr("FormatError");
  static py::object io = errors.attr("StorageError");
  static py::object base = errors.attr("KbcoreError");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const kbcore::InvalidArgument& e) {
      PyErr_SetString(invalid.ptr(), e.what());
    } catch (const kbcore::NotFound& e) {
      PyErr_SetString(not_found.ptr(), e.what());
    } catch (const kbcore::FormatError& e) {
      PyErr_SetString(format.ptr(), e.what());
    } catch (const kbcore::IoError& e) {
      PyErr_SetString(io.ptr(), e.what());
    } catch (const kbcore::Error& e) {
      PyErr_SetString(base.ptr(), e.what());
    }
  });
}

}  // namespace
}  // namespace kbcore::python

PYBIND11_MODULE(_core, m) {
  using namespace kbcore;
  m.doc() = "kbcore native core (C++). Use the kbcore package, not this module.";
  kbcore::python::register_errors(m);
  (void)huge_pages_enabled();  // reads KBCORE_HUGE_PAGES now, at import
  m.def(
      "simd_level", [] { return simd_level_name(active_simd_level()); },
      "The SIMD level of the distance kernels in use: 'scalar', 'avx2' or 'avx512'.");
  m.def(
      "available_simd_levels",
      [] {
        std::vector<std::string> out;
        for (SimdLevel l : supported_simd_levels()) out.push_back(simd_level_name(l));
        return out;
      },
      "SIMD levels this CPU and build can run, lowest first.");
  m.def(
      "set_simd_level", [](const std::string& name) { set_simd_level(parse_simd_level(name)); }, py::arg("level"),
      "Forces a SIMD level ('scalar', 'avx2', 'avx512').");
  m.def(
      "tokenize", [](const std::string& text, bool for_query) { return tokenize(text, for_query); }, py::arg("text"),
      py::arg("for_query") = false,
      "The BM25 tokens of a text: lower-cased words; CJK runs as character bigrams (documents "
      "also index single CJK characters).");
  m.def(
      "huge_pages", [] { return huge_pages_enabled(); },
      "Whether large native arrays allocated from now on (SQ8 codes, level-0 links, float32 rows, "
      "visited sets; each at least 4 MiB) are marked for transparent huge pages. Starts on unless "
      "the environment variable KBCORE_HUGE_PAGES is 0 / false / off / no when kbcore is imported.");
  m.def(
      "set_huge_pages", [](bool on) { set_huge_pages_enabled(on); }, py::arg("on"),
      "Sets the process-wide huge-page switch for allocations made after the call (including "
      "the reallocation of an array that grows); existing arrays keep their pages. Off marks new "
      "arrays MADV_NOHUGEPAGE. No effect outside Linux (huge_pages_supported()).");
  m.def(
      "_set_upper_beam",
      [](std::uint32_t divisor, std::size_t min_slots, std::uint32_t wide_divisor, std::size_t wide_min_slots) {
        g_upper_beam_divisor.store(divisor);
        g_upper_beam_min_slots.store(min_slots);
        g_upper_beam_wide_divisor.store(wide_divisor);
        g_upper_beam_wide_min_slots.store(wide_min_slots);
      },
      py::arg("divisor"), py::arg("min_slots"), py::arg("wide_divisor") = 0, py::arg("wide_min_slots") = 0,
      "Process-wide, for measurements and tests: a search of candidate list ef in a graph of at "
      "least min_slots slots keeps a beam of ef // divisor at level 1 of its descent, and of ef // "
      "wide_divisor in a graph of at least wide_min_slots (defaults 8 from 50,000 slots and 4 from "
      "500,000); divisor 0, a beam below 2 or a smaller graph: greedy at every level. "
      "wide_divisor 0 (the default of this call): ef // divisor at every size from min_slots.");
  m.def(
      "_upper_beam",
      [] {
        return py::make_tuple(g_upper_beam_divisor.load(), g_upper_beam_min_slots.load(),
                              g_upper_beam_wide_divisor.load(), g_upper_beam_wide_min_slots.load());
      },
      "The (divisor, min_slots, wide_divisor, wide_min_slots) that _set_upper_beam set (default "
      "(8, 50000, 4, 500000)).");
  m.def(
      "huge_pages_supported", [] { return huge_pages_supported(); },
      "True if this build maps large arrays for huge pages itself (Linux); elsewhere the switch "
      "is kept but changes nothing.");
  m.attr("MAX_M") = kMaxM;      // the largest M an index accepts (links per node on upper levels)
  m.attr("MAX_DIM") = kMaxDim;  // the largest dimension an index accepts
  m.attr("MAX_EF") = kMaxEf;    // the largest ef, ef_construction, rerank and search k
  m.def(
      "checksum64",
      [](py::bytes data) {
        const std::string_view v = data;
        return checksum64(v.data(), v.size());
      },
      py::arg("data"),
      "The payload checksum of a saved file (its header's last field), for tools and tests that "
      "craft files.");
  m.def(
      "block_checksum",
      [](py::bytes data) {
        const std::string_view v = data;
        return block_checksum(v.data(), v.size());
      },
      py::arg("data"),
      "The payload checksum of a block-checksummed file (index format version 6 and later): "
      "XXH3-64 of each 4 MiB block, then of those hashes. For tools and tests that craft files.");
  m.def(
      "code_types",
      [] {
        py::dict out;
        for_each_code_type([&](auto t) {
          using Traits = CodeTraits<typename decltype(t)::type>;
          py::dict params;
          for (const CodeParam& p : Traits::params()) params[p.name] = py::make_tuple(p.min, p.max, p.fallback);
          out[Traits::kName] = params;
        });
        return out;
      },
      "The code types a quantized index can walk its graph on, in registry order: name -> "
      "{parameter: (min, max, default)}.");
  kbcore::python::bind_filter(m);
  kbcore::python::bind_index(m);
  kbcore::python::bind_fast_search(m);
}
