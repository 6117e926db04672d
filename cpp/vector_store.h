#pragma once
// Vector storage with stable external ids: rows live in slots of one contiguous array,
// an id map gives each external int64 id its slot, and freed slots are reused by later adds.
// Not internally synchronised: the owning Index serialises writers against readers.
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "aligned.h"
#include "bitmap.h"
#include "graph_reorder.h"
#include "id_map.h"
#include "row_buffer.h"
#include "slot.h"

namespace kbcore {

class VectorStore {
 public:
  explicit VectorStore(std::size_t dim);

  std::size_t dim() const { return dim_; }
  /// Live rows.
  std::size_t size() const { return id_to_slot_.size(); }
  /// Slots ever allocated (live + free); slot numbers are < slot_count().
  std::size_t slot_count() const { return slot_ids_.size(); }
  /// Row of `slot` (dim floats). O(1). The pointer is invalidated by allocate().
  const float* vector(Slot slot) const { return data_.data() + static_cast<std::size_t>(slot) * dim_; }
  float* mutable_vector(Slot slot) { return data_.data() + static_cast<std::size_t>(slot) * dim_; }
  /// All rows, slot-major (slot_count() * dim floats).
  const float* data() const { return data_.data(); }
  bool is_live(Slot slot) const { return live_[slot] != 0; }
  /// Live slots as a bitmap of slot_count() bits.
  const Bitmap& live_bitmap() const { return live_bits_; }
  std::int64_t id_of(Slot slot) const { return slot_ids_[slot]; }
  /// Slot of `id`, if it is stored. O(1) expected.
  std::optional<Slot> slot_of(std::int64_t id) const;
  /// Stores `vec` under `id` (which must not be stored) in a free slot or a new one.
  Slot allocate(std::int64_t id, const float* vec);
  /// Frees `slot` for reuse; its id is forgotten.
  void release(Slot slot);
  /// Reserves room for `n` more rows so that allocate() does not reallocate.
  void reserve_more(std::size_t n);
  /// Live ids in slot order.
  std::vector<std::int64_t> ids() const;
  /// Keeps the rows in a memory-mapped temporary file (row_buffer.h) instead of the heap;
  /// only before the first row is stored. Throws IoError / InvalidArgument.
  void use_disk_rows(const char* dir = nullptr) { data_.use_disk(dir); }
  bool rows_on_disk() const { return data_.on_disk(); }
  /// True while the rows are read in place from a loaded file (row_buffer.h).
  bool rows_in_place() const { return data_.in_place(); }
  /// Rows read in place are copied to where the first write would put them (the heap, or a
  /// row file for rows on disk); a no-op otherwise.
  void copy_rows_to_heap() { (void)data_.data(); }
  /// Drops file-mapped rows from the resident set (no-op for heap rows).
  void release_resident_rows() const { data_.release_resident(); }
  /// Bytes held (rows, ids, map), approximately.
  std::size_t memory_bytes() const;

  /// Moves row, id and live flag of old slot p.new_to_old[i] to slot i (graph_reorder.h); the
  /// id map follows. O(slot_count * dim): the rows move in place (no second copy). Not
  /// thread-safe.
  /// `moved`, if given, is permuted_rows(p) made earlier: it is installed instead of moving the
  /// rows, provided the rows are still read in place with the same slots (else it is dropped).
  void permute_slots(const SlotPermutation& p, std::optional<RowBuffer> moved = std::nullopt);
  /// The rows in the order of `p`, when they are read in place from a loaded file: the copy
  /// their first write would make anyway, made while readers run (a const read), so that
  /// permute_slots need not copy them. std::nullopt for rows on the heap or in a row file (they
  /// move in place) or a permutation of another size. O(slot_count * dim).
  std::optional<RowBuffer> permuted_rows(const SlotPermutation& p) const;

  /// Raw state for persistence: ids per slot, live flags per slot, rows.
  const std::vector<std::int64_t>& slot_ids() const { return slot_ids_; }
  const std::vector<std::uint8_t>& live_flags() const { return live_; }
  /// Rebuilds from persisted state; validates ids (unique among live slots).
  void restore(std::vector<std::int64_t> slot_ids, std::vector<std::uint8_t> live, AlignedVector<float> data);
  /// The same with the rows read in place from a read-only file mapping kept alive by
  /// `owner` (slot_ids.size() * dim floats at `rows`, 64-byte aligned): rows on disk
  /// (RowBuffer::use_mapped) or, `on_disk` false, rows in memory (RowBuffer::use_mapped_heap).
  void restore_mapped(std::vector<std::int64_t> slot_ids, std::vector<std::uint8_t> live,
                      std::shared_ptr<const void> owner, const float* rows, bool on_disk = true);

 private:
  /// Validates and installs ids and live flags (the rows are installed by the caller).
  void restore_slots(std::vector<std::int64_t> slot_ids, std::vector<std::uint8_t> live);
  std::size_t dim_;
  RowBuffer data_;                      // slot_count() * dim_
  std::vector<std::int64_t> slot_ids_;  // id per slot (stale for free slots)
  std::vector<std::uint8_t> live_;      // 1 if the slot holds a live row
  Bitmap live_bits_;                    // the same, as bits
  std::vector<Slot> free_;              // freed slots, reused LIFO
  IdMap id_to_slot_;                    // live ids -> slots (keys read from slot_ids_)
};

}  // namespace kbcore
