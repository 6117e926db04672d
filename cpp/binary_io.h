#pragma once
// Versioned binary persistence: explicit little-endian fields, a checksum over the payload,
// atomic replacement of the target file (temp file, fsync, rename), and a reader that checks
// every count against the bytes remaining before anything is allocated.
//
// File layout: magic[8] | u32 format_version | u32 flags | u64 payload_bytes | u64 checksum | payload
//
// The checksum is one of two functions of the payload, chosen by the file kind's format version:
// checksum64 (one serial pass, about 1.5 GB/s) in older versions, block_checksum (XXH3 per
// 4 MiB block, the blocks hashed in parallel at memory speed) in newer ones.
#include <cstdint>
#include <cstdio>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kbcore {

#if defined(_WIN32)
/// `path` (UTF-8, as kbcore's paths are) as UTF-16 for the wide Windows file API. Throws IoError
/// if it is not valid UTF-8.
std::wstring wide_path(const std::string& path);
#endif

/// Whether this machine stores integers little-endian (the byte order of every kbcore file).
constexpr bool host_little_endian() {
#if defined(__BYTE_ORDER__) && defined(__ORDER_BIG_ENDIAN__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  return false;
#else
  return true;
#endif
}

/// 64-bit checksum of a byte range (a multiply-rotate hash; detects corruption, not tampering).
std::uint64_t checksum64(const void* data, std::size_t n, std::uint64_t seed = 0);

/// Bytes per block of block_checksum.
constexpr std::size_t kChecksumBlockBytes = std::size_t{4} << 20;

/// The payload checksum of block-checksummed files: XXH3-64 (seed 0) of each kChecksumBlockBytes
/// block of the payload (the last one shorter), then XXH3-64 of those hashes stored as
/// little-endian u64s. O(n); the blocks go to `threads` threads (0: the hardware's).
std::uint64_t block_checksum(const void* data, std::size_t n, std::size_t threads = 1);

/// The per-block XXH3-64 hashes block_checksum combines (one per kChecksumBlockBytes block).
std::vector<std::uint64_t> block_hashes(const void* data, std::size_t n, std::size_t threads = 1);

/// Which function a file's header checksum is (see the file comment).
enum class PayloadChecksum { kWords, kBlocks };

/// Streams a payload into `path` atomically: bytes go to a temp file beside it, and
/// commit() fixes the header, fsyncs and renames. Destroying an uncommitted writer removes
/// the temp file, so a failure never leaves a half-written target.
class BinaryWriter {
 public:
  BinaryWriter(const std::string& path, const char magic[8], std::uint32_t version,
               PayloadChecksum sum = PayloadChecksum::kWords);
  ~BinaryWriter();
  BinaryWriter(const BinaryWriter&) = delete;
  BinaryWriter& operator=(const BinaryWriter&) = delete;

  void u8(std::uint8_t v);
  void u32(std::uint32_t v);
  void u64(std::uint64_t v);
  void i64(std::int64_t v);
  void f32(float v);
  /// Writes n elements of a 1-, 4- or 8-byte type as little-endian.
  template <typename T>
  void array(const T* data, std::size_t n) {
    static_assert(sizeof(T) == 1 || sizeof(T) == 4 || sizeof(T) == 8, "unsupported element size");
    raw_le(data, n, sizeof(T));
  }
  /// Writes zero bytes until the file offset of the next byte is a multiple of `align`
  /// (so that a section mapped in place is aligned; BinaryReader::skip_padding reads them).
  void pad_to(std::size_t align);
  /// Finishes the file and moves it into place. Throws IoError on failure.
  void commit();
  /// The format version the file is written in (sections whose layout depends on it read it).
  std::uint32_t version() const { return version_; }

 private:
  void raw_le(const void* data, std::size_t n, std::size_t elem);
  void put(const void* data, std::size_t bytes);
  std::string path_;
  std::string tmp_path_;
  std::FILE* file_ = nullptr;
  std::uint64_t payload_bytes_ = 0;
  std::vector<unsigned char> buffer_;  // flushed when it holds buffer_cap_ bytes
  std::size_t buffer_cap_ = std::size_t{1} << 20;
  PayloadChecksum sum_kind_ = PayloadChecksum::kWords;
  std::uint32_t version_ = 0;
  std::uint64_t hash_state_ = 0;       // kWords: the running checksum64 state
  std::vector<std::uint64_t> blocks_;  // kBlocks: the hashes of the blocks flushed so far
  bool committed_ = false;
};

/// A read-only private mapping of a whole file (unmapped with its last owner), or its bytes
/// read into the heap where the platform has no mmap. The file must not be rewritten in place
/// while mapped (kbcore replaces files by rename, which leaves a mapping intact).
class FileBytes {
 public:
  /// Throws NotFound / IoError naming `path`.
  explicit FileBytes(const std::string& path);
  ~FileBytes();
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;
  const unsigned char* data() const { return data_; }
  std::size_t size() const { return size_; }
  /// True if the bytes are a file mapping (reading them costs no anonymous memory).
  bool mapped() const { return mapped_; }
  /// Drops the mapping's pages from the resident set (they fault back in from the file).
  void release_resident() const;
  /// The same except the whole pages inside each kept range [start, start + bytes) (bytes of
  /// this file; ranges in any order, empty ones ignored).
  void release_resident_except(std::vector<std::pair<const void*, std::size_t>> keep) const;

 private:
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
  bool mapped_ = false;
  std::vector<unsigned char> heap_;
};

/// Reads a whole file written by BinaryWriter, verifying magic, version, size and checksum
/// before any field is parsed. Every read is bounds-checked and throws FormatError.
class BinaryReader {
 public:
  /// When the payload checksum is compared: before the constructor returns, or on a second
  /// thread while the caller parses (the caller then calls verify() before using anything it
  /// read, and on any exception, so that a damaged file reports the checksum).
  enum class Checksum { kBefore, kAlongside };

  /// Throws FileNotFound-style IoError if the file can't be opened, FormatError if it is
  /// not a valid file of this magic, or if its version is newer than `max_version`. Files of
  /// version `blocks_from` and later carry a block_checksum (0: none does), earlier ones a
  /// checksum64; block checksums are computed on all hardware threads.
  BinaryReader(const std::string& path, const char magic[8], std::uint32_t max_version,
               Checksum when = Checksum::kBefore, std::uint32_t blocks_from = 0);
  /// Waits for a checksum computed alongside (kAlongside) and throws FormatError if it does not
  /// match; nothing otherwise. May be called more than once.
  void verify() const;
  /// For a block-checksummed file: whether the payload blocks under this reader's bytes (all of
  /// them, from its start, not its position) still hash as when the payload checksum was
  /// computed (waits for it; a file rewritten in place since shows through a private mapping).
  /// nullopt for a checksum64 file. O(bytes, rounded out to whole blocks).
  std::optional<bool> blocks_unchanged() const;
  /// Whether the file carries a block_checksum (so blocks_unchanged() answers).
  bool block_checksummed() const { return blocks_; }

  std::uint32_t version() const { return version_; }
  // The field readers are inline: a load reads a few fields per row (metadata, BM25 rows).
  std::uint8_t u8() {
    require(1, 1);
    return data_[pos_++];
  }
  std::uint32_t u32() {
    require(1, 4);
    const auto v = static_cast<std::uint32_t>(le(data_ + pos_, 4));
    pos_ += 4;
    return v;
  }
  std::uint64_t u64() {
    require(1, 8);
    const std::uint64_t v = le(data_ + pos_, 8);
    pos_ += 8;
    return v;
  }
  std::int64_t i64() { return static_cast<std::int64_t>(u64()); }
  float f32();
  /// Reads n elements into out (resized); checks n * sizeof(T) against the bytes remaining
  /// before allocating.
  template <typename T, typename A>
  void array(std::vector<T, A>& out, std::size_t n) {
    static_assert(sizeof(T) == 1 || sizeof(T) == 4 || sizeof(T) == 8, "unsupported element size");
    require(n, sizeof(T));
    out.resize(n);
    raw_le(out.data(), n, sizeof(T));
  }
  /// Same as array() into a caller buffer of n elements.
  template <typename T>
  void array_into(T* out, std::size_t n) {
    require(n, sizeof(T));
    raw_le(out, n, sizeof(T));
  }
  /// Throws FormatError unless n elements of `elem` bytes remain.
  void require(std::size_t n, std::size_t elem) const {
    if (elem != 0 && n > remaining() / elem) fail_truncated(n, elem);
  }
  std::size_t remaining() const { return size_ - pos_; }
  /// Throws FormatError if any payload bytes are left unread.
  void expect_end() const;
  /// Reads the zero bytes BinaryWriter::pad_to(align) wrote (FormatError if one is not zero).
  void skip_padding(std::size_t align);
  /// The file's bytes (shared: a section read in place keeps them alive).
  const std::shared_ptr<const FileBytes>& bytes() const { return file_; }
  /// The next unread payload byte, for a section used in place; skip() passes over it.
  const unsigned char* here() const { return data_ + pos_; }
  /// Passes over n elements of `elem` bytes (FormatError unless they are present).
  void skip(std::size_t n, std::size_t elem);
  /// Payload bytes read so far.
  std::size_t position() const { return pos_; }
  /// A reader of payload bytes [begin, end) (end <= position()) of this file, sharing its
  /// bytes, name and version, positioned at begin: for a section checked now and parsed
  /// again later. Its offsets start at 0 (skip_padding is meaningless on it).
  BinaryReader section(std::size_t begin, std::size_t end) const;
  /// Throws FormatError with `what` and the file name.
  [[noreturn]] void fail(const std::string& what) const;

 private:
  void raw_le(void* out, std::size_t n, std::size_t elem);
  [[noreturn]] void fail_truncated(std::size_t n, std::size_t elem) const;
  // The little-endian unsigned integer of `bytes` (<= 8) bytes at p.
  static std::uint64_t le(const unsigned char* p, int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
    return v;
  }
  std::string path_;
  std::shared_ptr<const FileBytes> file_;
  const unsigned char* data_ = nullptr;  // the payload (after the header)
  std::size_t size_ = 0;                 // payload bytes
  std::size_t pos_ = 0;
  std::uint32_t version_ = 0;
  // The payload's checksum as computed, and for a block checksum the hashes of its blocks.
  struct PayloadSums {
    std::uint64_t sum = 0;
    std::vector<std::uint64_t> blocks;  // empty for checksum64
  };
  const unsigned char* payload_ = nullptr;  // the payload's first byte (a section() keeps its file's)
  std::size_t payload_size_ = 0;            // the payload's bytes (likewise)
  std::uint64_t sum_ = 0;                   // the header's checksum
  // The payload's sums: computed on a second thread (kAlongside, from 4 MiB), else before the
  // constructor returned; shared by the readers section() makes.
  std::shared_future<std::shared_ptr<const PayloadSums>> sums_;
  bool alongside_ = false;  // sums_ still to be compared with sum_ by verify()
  bool blocks_ = false;     // a block_checksum file
};

}  // namespace kbcore
