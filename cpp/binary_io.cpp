#include "binary_io.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <random>
#include <system_error>

#include "distance.h"
#include "errors.h"
#include "parallel.h"
#if defined(KBCORE_HAVE_X86_KERNELS)
#include "xxh3_avx2.h"
#endif

// XXH3 (third_party/xxhash, BSD-2-Clause), compiled into this file (and with AVX2 into xxh3_avx2.cpp).
#define XXH_INLINE_ALL
#include "xxhash.h"

#if defined(_WIN32)
#ifndef NOMINMAX
#define NOMINMAX
#endif
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <io.h>
#include <windows.h>
#else
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

namespace kbcore {
namespace {

constexpr std::size_t kHeaderBytes = 8 + 4 + 4 + 8 + 8;
constexpr std::uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr std::uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;

inline std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline std::uint64_t mix(std::uint64_t h, std::uint64_t w) {
  h ^= rotl(w * kP2, 31) * kP1;
  return rotl(h, 27) * kP1 + 0x165667B19E3779F9ULL;
}

void swap_bytes(unsigned char* p, std::size_t n, std::size_t elem) {
  for (std::size_t i = 0; i < n; ++i) {
    unsigned char* e = p + i * elem;
    for (std::size_t a = 0, b = elem - 1; a < b; ++a, --b) std::swap(e[a], e[b]);
  }
}

void store_le64(unsigned char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
std::uint64_t load_le(const unsigned char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

// The checksum is computed over whole 8-byte words plus a tail; streaming it needs the
// same word boundaries, so the writer hashes its buffer in 8-byte multiples.
std::uint64_t hash_words(std::uint64_t h, const unsigned char* p, std::size_t n) {
  for (std::size_t i = 0; i + 8 <= n; i += 8) h = mix(h, load_le(p + i, 8));
  return h;
}
std::uint64_t hash_finish(std::uint64_t h, const unsigned char* tail, std::size_t n, std::uint64_t total) {
  std::uint64_t w = 0;
  for (std::size_t i = 0; i < n; ++i) w |= static_cast<std::uint64_t>(tail[i]) << (8 * i);
  h = mix(h, w ^ (static_cast<std::uint64_t>(n) << 56));
  h ^= total;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  return h;
}

// XXH3-64 of n bytes: the AVX2 build where the CPU has it and the distance kernels may use it
// (KBCORE_SIMD=scalar forces the portable one here too), else the portable build; one hash.
std::uint64_t xxh3(const void* data, std::size_t n) {
#if defined(KBCORE_HAVE_X86_KERNELS)
  if (active_simd_level() != SimdLevel::kScalar) return xxh3_64_avx2(data, n);
#endif
  return XXH3_64bits(data, n);
}

std::string errno_text() { return std::strerror(errno); }

// 64-bit file positions on every platform (long is 32 bits on Windows).
int seek64(std::FILE* f, std::int64_t off, int whence) {
#if defined(_WIN32)
  return _fseeki64(f, off, whence);
#else
  return fseeko(f, static_cast<off_t>(off), whence);
#endif
}
#if defined(_WIN32)
// Only FileBytes' read fallback (no mmap) needs the file size from the stream.
std::int64_t tell64(std::FILE* f) { return _ftelli64(f); }

std::string win_error_text(DWORD code) { return "Windows error " + std::to_string(static_cast<unsigned long>(code)); }
#endif

std::FILE* open_file(const std::string& path, const char* mode) {
#if defined(_WIN32)
  const std::wstring wmode(mode, mode + std::strlen(mode));
  return ::_wfopen(wide_path(path).c_str(), wmode.c_str());
#else
  return std::fopen(path.c_str(), mode);
#endif
}

void remove_file(const std::string& path) {
#if defined(_WIN32)
  ::_wremove(wide_path(path).c_str());
#else
  std::remove(path.c_str());
#endif
}

// Flushes the file's data to the device: fsync (F_FULLFSYNC on macOS, where fsync leaves the
// data in the drive's cache), _commit (FlushFileBuffers) on Windows.
bool sync_file(std::FILE* f) {
#if defined(_WIN32)
  return ::_commit(::_fileno(f)) == 0;
#elif defined(__APPLE__)
  const int fd = ::fileno(f);
  return ::fcntl(fd, F_FULLFSYNC) == 0 || ::fsync(fd) == 0;
#else
  return ::fsync(::fileno(f)) == 0;
#endif
}

// Moves `from` over `to` in one step: rename(2) on POSIX; on Windows MoveFileExW replacing the
// target (rename there fails when the target exists) and returning only once the move is on
// disk. Returns an empty string or the reason it failed.
std::string replace_file(const std::string& from, const std::string& to) {
#if defined(_WIN32)
  if (::MoveFileExW(wide_path(from).c_str(), wide_path(to).c_str(),
                    MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH) == 0) {
    return win_error_text(::GetLastError());
  }
  return std::string();
#else
  if (std::rename(from.c_str(), to.c_str()) != 0) return errno_text();
  return std::string();
#endif
}

}  // namespace

#if defined(_WIN32)
// kbcore's paths are UTF-8 (Python's str); the narrow C runtime calls would read them in the
// ANSI code page, so every file call goes through the wide API.
std::wstring wide_path(const std::string& path) {
  if (path.empty()) return std::wstring();
  const int n =
      ::MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, path.data(), static_cast<int>(path.size()), nullptr, 0);
  if (n <= 0) throw IoError("'" + path + "' is not a valid UTF-8 path");
  std::wstring out(static_cast<std::size_t>(n), L'\0');
  ::MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, path.data(), static_cast<int>(path.size()), &out[0], n);
  return out;
}
#endif

std::uint64_t checksum64(const void* data, std::size_t n, std::uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  const std::size_t body = n & ~static_cast<std::size_t>(7);
  const std::uint64_t h = hash_words(seed ^ kP1, p, body);
  return hash_finish(h, p + body, n - body, n);
}

std::vector<std::uint64_t> block_hashes(const void* data, std::size_t n, std::size_t threads) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::vector<std::uint64_t> hashes((n + kChecksumBlockBytes - 1) / kChecksumBlockBytes);
  parallel_for(hashes.size(), threads, [&](std::size_t b, std::size_t) {
    const std::size_t begin = b * kChecksumBlockBytes;
    hashes[b] = xxh3(p + begin, std::min(kChecksumBlockBytes, n - begin));
  });
  return hashes;
}

namespace {

std::uint64_t combine_blocks(const std::vector<std::uint64_t>& hashes) {
  std::vector<unsigned char> bytes(hashes.size() * 8);
  for (std::size_t b = 0; b < hashes.size(); ++b) store_le64(bytes.data() + b * 8, hashes[b]);
  return xxh3(bytes.data(), bytes.size());
}

}  // namespace

std::uint64_t block_checksum(const void* data, std::size_t n, std::size_t threads) {
  return combine_blocks(block_hashes(data, n, threads));
}

BinaryWriter::BinaryWriter(const std::string& path, const char magic[8], std::uint32_t version, PayloadChecksum sum)
    : path_(path), sum_kind_(sum), version_(version) {
  std::random_device rd;
  tmp_path_ = path + ".tmp-" + std::to_string(rd()) + std::to_string(rd());
  file_ = open_file(tmp_path_, "wb");
  if (file_ == nullptr) {
    throw IoError("cannot write '" + path + "': " + errno_text());
  }
  unsigned char header[kHeaderBytes] = {};
  std::memcpy(header, magic, 8);
  for (int i = 0; i < 4; ++i) header[8 + i] = static_cast<unsigned char>(version >> (8 * i));
  if (std::fwrite(header, 1, kHeaderBytes, file_) != kHeaderBytes) {
    throw IoError("cannot write '" + path + "': " + errno_text());
  }
  hash_state_ = kP1;
  // A block-checksummed payload is flushed a block at a time, so that each flush hashes one.
  if (sum_kind_ == PayloadChecksum::kBlocks) buffer_cap_ = kChecksumBlockBytes;
  buffer_.reserve(buffer_cap_);
}

BinaryWriter::~BinaryWriter() {
  if (file_ != nullptr) std::fclose(file_);
  if (!committed_) remove_file(tmp_path_);
}

void BinaryWriter::put(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  payload_bytes_ += bytes;
  while (bytes > 0) {
    const std::size_t room = buffer_cap_ - buffer_.size();
    const std::size_t take = std::min(room, bytes);
    buffer_.insert(buffer_.end(), p, p + take);
    p += take;
    bytes -= take;
    if (buffer_.size() == buffer_cap_) {
      if (sum_kind_ == PayloadChecksum::kBlocks) {
        blocks_.push_back(xxh3(buffer_.data(), buffer_.size()));
      } else {
        hash_state_ = hash_words(hash_state_, buffer_.data(), buffer_.size());
      }
      if (std::fwrite(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size()) {
        throw IoError("cannot write '" + path_ + "': " + errno_text());
      }
      buffer_.clear();
    }
  }
}

void BinaryWriter::raw_le(const void* data, std::size_t n, std::size_t elem) {
  if (host_little_endian() || elem == 1) {
    put(data, n * elem);
    return;
  }
  std::vector<unsigned char> tmp(static_cast<const unsigned char*>(data),
                                 static_cast<const unsigned char*>(data) + n * elem);
  swap_bytes(tmp.data(), n, elem);
  put(tmp.data(), tmp.size());
}

void BinaryWriter::u8(std::uint8_t v) { put(&v, 1); }
void BinaryWriter::u32(std::uint32_t v) {
  unsigned char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
  put(b, 4);
}
void BinaryWriter::u64(std::uint64_t v) {
  unsigned char b[8];
  store_le64(b, v);
  put(b, 8);
}
void BinaryWriter::i64(std::int64_t v) { u64(static_cast<std::uint64_t>(v)); }
void BinaryWriter::f32(float v) {
  std::uint32_t bits;
  std::memcpy(&bits, &v, 4);
  u32(bits);
}

void BinaryWriter::commit() {
  std::uint64_t sum = 0;
  if (sum_kind_ == PayloadChecksum::kBlocks) {
    if (!buffer_.empty()) blocks_.push_back(xxh3(buffer_.data(), buffer_.size()));
    sum = combine_blocks(blocks_);
  } else {
    const std::size_t body = buffer_.size() & ~static_cast<std::size_t>(7);
    hash_state_ = hash_words(hash_state_, buffer_.data(), body);
    sum = hash_finish(hash_state_, buffer_.data() + body, buffer_.size() - body, payload_bytes_);
  }
  if (!buffer_.empty() && std::fwrite(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size()) {
    throw IoError("cannot write '" + path_ + "': " + errno_text());
  }
  unsigned char tail[16];
  store_le64(tail, payload_bytes_);
  store_le64(tail + 8, sum);
  if (seek64(file_, 16, SEEK_SET) != 0 || std::fwrite(tail, 1, 16, file_) != 16 || std::fflush(file_) != 0) {
    throw IoError("cannot write '" + path_ + "': " + errno_text());
  }
  if (!sync_file(file_)) throw IoError("cannot sync '" + path_ + "': " + errno_text());
  const int closed = std::fclose(file_);
  file_ = nullptr;
  if (closed != 0) throw IoError("cannot write '" + path_ + "': " + errno_text());
  const std::string moved = replace_file(tmp_path_, path_);
  if (!moved.empty()) throw IoError("cannot move the saved index into place at '" + path_ + "': " + moved);
  committed_ = true;
#if !defined(_WIN32)
  // fsync the directory so that the rename itself survives a crash.
  const std::size_t slash = path_.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path_.substr(0, slash));
  const int fd = ::open(dir.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
#endif
}

void BinaryWriter::pad_to(std::size_t align) {
  static const unsigned char zeros[64] = {};
  const std::uint64_t offset = kHeaderBytes + payload_bytes_;
  std::size_t pad = static_cast<std::size_t>((align - offset % align) % align);
  while (pad > 0) {
    const std::size_t take = std::min<std::size_t>(pad, sizeof(zeros));
    put(zeros, take);
    pad -= take;
  }
}

FileBytes::FileBytes(const std::string& path) {
#if defined(_WIN32)
  // No mapping here: Windows refuses to replace a file that is mapped, and kbcore saves over
  // the files it loaded. The bytes are read into the heap instead (mapped() is false, so a
  // vectors='disk' index copies its rows, see RowBuffer).
  std::FILE* f = open_file(path, "rb");
  if (f == nullptr) {
    if (errno == ENOENT) throw NotFound("no such file: '" + path + "'");
    throw IoError("cannot open '" + path + "': " + errno_text());
  }
  struct Closer {
    std::FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{f};
  if (seek64(f, 0, SEEK_END) != 0) throw IoError("cannot determine the size of '" + path + "'");
  const std::int64_t end = tell64(f);
  if (end < 0 || seek64(f, 0, SEEK_SET) != 0) throw IoError("cannot determine the size of '" + path + "'");
  heap_.resize(static_cast<std::size_t>(end));
  if (std::fread(heap_.data(), 1, heap_.size(), f) != heap_.size()) throw IoError("cannot read '" + path + "'");
  data_ = heap_.data();
  size_ = heap_.size();
#else
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) throw NotFound("no such file: '" + path + "'");
    throw IoError("cannot open '" + path + "': " + errno_text());
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw IoError("cannot stat '" + path + "': " + errno_text());
  if (!S_ISREG(st.st_mode)) throw IoError("'" + path + "' is not a regular file");
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ == 0) return;
  // Every byte is read at once (the payload checksum): populating the page table in the mmap
  // call costs a fraction of faulting the pages in one 64 KiB window at a time (issue 28).
  int flags = MAP_PRIVATE;
#if defined(MAP_POPULATE)
  flags |= MAP_POPULATE;
#endif
  void* p = ::mmap(nullptr, size_, PROT_READ, flags, fd, 0);
  if (p == MAP_FAILED) throw IoError("cannot map '" + path + "': " + errno_text());
  data_ = static_cast<const unsigned char*>(p);
  mapped_ = true;
#endif
}

FileBytes::~FileBytes() {
#if !defined(_WIN32)
  if (mapped_) ::munmap(const_cast<unsigned char*>(data_), size_);
#endif
}

void FileBytes::release_resident() const {
#if !defined(_WIN32)
  if (mapped_) ::madvise(const_cast<unsigned char*>(data_), size_, MADV_DONTNEED);
#endif
}

void FileBytes::release_resident_except(std::vector<std::pair<const void*, std::size_t>> keep) const {
#if !defined(_WIN32)
  if (!mapped_) return;
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const auto base = reinterpret_cast<std::uintptr_t>(data_);
  std::sort(keep.begin(), keep.end(),
            [](const auto& x, const auto& y) { return std::less<const void*>()(x.first, y.first); });
  auto* p = const_cast<unsigned char*>(data_);
  std::size_t from = 0;  // the first byte not yet released or kept
  for (const auto& [start, bytes] : keep) {
    if (bytes == 0) continue;
    const auto k = reinterpret_cast<std::uintptr_t>(start);
    // The kept range rounded inward to whole pages (the mapping itself starts page-aligned).
    const std::size_t begin = std::min<std::size_t>(size_, (k - base + page - 1) / page * page);
    const std::size_t end =
        std::max<std::size_t>(begin, std::min<std::size_t>(size_, (k - base + bytes) / page * page));
    if (begin > from) ::madvise(p + from, begin - from, MADV_DONTNEED);
    from = std::max(from, end);
  }
  if (from < size_) ::madvise(p + from, size_ - from, MADV_DONTNEED);
#else
  (void)keep;
#endif
}

BinaryReader::BinaryReader(const std::string& path, const char magic[8], std::uint32_t max_version, Checksum when,
                           std::uint32_t blocks_from)
    : path_(path) {
  // The file is mapped, not read: a section used in place (vectors='disk' rows) costs no
  // anonymous memory, and the checksum pass below only brings pages into the page cache.
  file_ = std::make_shared<const FileBytes>(path);
  const unsigned char* header = file_->data();
  const std::size_t got = std::min(file_->size(), kHeaderBytes);
  if (got < 8 || std::memcmp(header, magic, 8) != 0) {
    fail("not a kbcore file of this kind (bad magic)");
  }
  if (got < kHeaderBytes) fail("truncated header");
  version_ = static_cast<std::uint32_t>(load_le(header + 8, 4));
  if (version_ == 0 || version_ > max_version) {
    throw FormatError("'" + path + "' has format version " + std::to_string(version_) +
                      ", this kbcore reads versions 1.." + std::to_string(max_version) + "; upgrade kbcore to load it");
  }
  if (load_le(header + 12, 4) != 0) fail("unknown header flags (corrupted file)");
  const std::uint64_t payload = load_le(header + 16, 8);
  const std::uint64_t sum = load_le(header + 24, 8);
  const std::uint64_t actual = file_->size() - kHeaderBytes;
  if (payload != actual) {
    fail("size mismatch: header says " + std::to_string(payload) + " payload bytes, file has " +
         std::to_string(actual) + " (truncated or appended to)");
  }
  data_ = header + kHeaderBytes;
  payload_ = data_;
  size_ = static_cast<std::size_t>(payload);
  payload_size_ = size_;
  sum_ = sum;
  const bool blocks = blocks_from != 0 && version_ >= blocks_from;
  blocks_ = blocks;
  // Block hashes go to every hardware thread (memory bandwidth, not one core, bounds them); they
  // are kept, so that a section checked later can tell its bytes unchanged (blocks_unchanged).
  const auto payload_sums = [blocks](const unsigned char* data, std::size_t n) {
    auto out = std::make_shared<PayloadSums>();
    if (blocks) {
      out->blocks = block_hashes(data, n, 0);
      out->sum = combine_blocks(out->blocks);
    } else {
      out->sum = checksum64(data, n, 0);
    }
    return std::shared_ptr<const PayloadSums>(std::move(out));
  };
  // Below a few MiB a thread costs more than it saves. The task holds the file's bytes alive.
  if (when == Checksum::kAlongside && size_ >= (std::size_t{4} << 20)) {
    try {
      sums_ = std::async(std::launch::async, [file = file_, data = data_, n = size_, payload_sums] {
                return payload_sums(data, n);
              }).share();
      alongside_ = true;
      return;
    } catch (const std::system_error&) {
      // No thread to be had: compare it now.
    }
  }
  std::promise<std::shared_ptr<const PayloadSums>> now;
  now.set_value(payload_sums(data_, size_));
  sums_ = now.get_future().share();
  if (sums_.get()->sum != sum) fail("checksum mismatch (corrupted file)");
}

void BinaryReader::verify() const {
  if (alongside_ && sums_.get()->sum != sum_) fail("checksum mismatch (corrupted file)");
}

std::optional<bool> BinaryReader::blocks_unchanged() const {
  const std::vector<std::uint64_t>& hashes = sums_.get()->blocks;
  if (hashes.empty()) return std::nullopt;
  const std::size_t begin = static_cast<std::size_t>(data_ - payload_);
  for (std::size_t b = begin / kChecksumBlockBytes; b * kChecksumBlockBytes < begin + size_; ++b) {
    if (b >= hashes.size()) return false;  // not reached: the reader's bytes lie in the payload
    // The block as the checksum took it: kChecksumBlockBytes, the payload's last one shorter.
    const std::size_t from = b * kChecksumBlockBytes;
    if (xxh3(payload_ + from, std::min(kChecksumBlockBytes, payload_size_ - from)) != hashes[b]) return false;
  }
  return true;
}

void BinaryReader::fail(const std::string& what) const { throw FormatError("cannot load '" + path_ + "': " + what); }

void BinaryReader::fail_truncated(std::size_t n, std::size_t elem) const {
  fail("truncated payload: need " + std::to_string(n) + " x " + std::to_string(elem) + " bytes, " +
       std::to_string(remaining()) + " remain");
}

void BinaryReader::raw_le(void* out, std::size_t n, std::size_t elem) {
  require(n, elem);
  if (n == 0) return;  // out may be null (an empty vector's data()): memcpy must not see it
  std::memcpy(out, data_ + pos_, n * elem);
  pos_ += n * elem;
  if (!host_little_endian() && elem > 1) swap_bytes(static_cast<unsigned char*>(out), n, elem);
}

float BinaryReader::f32() {
  const std::uint32_t bits = u32();
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}
void BinaryReader::expect_end() const {
  if (remaining() != 0) fail(std::to_string(remaining()) + " unexpected trailing payload bytes");
}
void BinaryReader::skip(std::size_t n, std::size_t elem) {
  require(n, elem);
  pos_ += n * elem;
}
BinaryReader BinaryReader::section(std::size_t begin, std::size_t end) const {
  if (begin > end || end > size_) fail("invalid section range");
  BinaryReader out = *this;
  out.data_ = data_ + begin;
  out.size_ = end - begin;
  out.pos_ = 0;
  return out;
}

void BinaryReader::skip_padding(std::size_t align) {
  const std::size_t pad = (align - (kHeaderBytes + pos_) % align) % align;
  require(pad, 1);
  for (std::size_t i = 0; i < pad; ++i) {
    if (data_[pos_ + i] != 0) fail("nonzero padding byte at payload offset " + std::to_string(pos_ + i));
  }
  pos_ += pad;
}

}  // namespace kbcore
