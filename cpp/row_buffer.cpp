// RowBuffer (row_buffer.h): heap rows, or rows in a shared mapping of an unlinked temp file.
#include "row_buffer.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "errors.h"

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#define KBCORE_HAVE_MMAP 1
#endif

namespace kbcore {

RowBuffer::~RowBuffer() {
#if defined(KBCORE_HAVE_MMAP)
  if (map_ != nullptr) ::munmap(map_, cap_ * sizeof(float));
  if (fd_ >= 0) ::close(fd_);
#endif
}

RowBuffer::RowBuffer(RowBuffer&& o) noexcept
    : heap_(std::move(o.heap_)),
      fd_(std::exchange(o.fd_, -1)),
      map_(std::exchange(o.map_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      cap_(std::exchange(o.cap_, 0)),
      dir_(std::move(o.dir_)),
      file_name_(std::move(o.file_name_)),
      owner_(std::move(o.owner_)),
      view_(std::exchange(o.view_, nullptr)) {}

RowBuffer& RowBuffer::operator=(RowBuffer&& o) noexcept {
  if (this != &o) {
    this->~RowBuffer();
    new (this) RowBuffer(std::move(o));
  }
  return *this;
}

namespace {

#if defined(KBCORE_HAVE_MMAP)
// Creates an unlinked temporary row file in `base`; returns its descriptor and sets `name`.
int open_row_file(const std::string& base, std::string& name) {
  std::string tmpl = base + "/kbcore-rows-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  const int fd = ::mkstemp(buf.data());
  if (fd < 0) throw IoError("cannot create a row file in " + base + ": " + std::strerror(errno));
  ::unlink(buf.data());  // the file lives as long as the descriptor
  name = buf.data();
  return fd;
}

// Makes the bytes [from, to) of the file real blocks, so that writing them through a shared
// mapping cannot fail (a sparse page that the full file system cannot back is a SIGBUS).
// Returns 0 or an errno value.
int reserve_file_space(int fd, std::size_t from, std::size_t to) {
  if (to <= from) return 0;
#if defined(__linux__) || defined(__FreeBSD__)
  const int rc = ::posix_fallocate(fd, static_cast<off_t>(from), static_cast<off_t>(to - from));
  if (rc != EINVAL && rc != EOPNOTSUPP) return rc;
#endif
  // Portable fallback (file systems or systems without fallocate): write the zeros.
  static const char zeros[1 << 16] = {};
  for (std::size_t off = from; off < to;) {
    const std::size_t take = std::min(sizeof(zeros), to - off);
    const ssize_t n = ::pwrite(fd, zeros, take, static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    off += static_cast<std::size_t>(n);
  }
  return 0;
}

std::string row_dir(const std::string& dir) {
  if (!dir.empty()) return dir;
  const char* env = std::getenv("TMPDIR");
  return env != nullptr && *env ? env : "/tmp";
}
#endif

}  // namespace

void RowBuffer::use_disk(const char* dir) {
#if defined(KBCORE_HAVE_MMAP)
  if (size() != 0) throw InvalidArgument("vectors='disk' must be chosen before rows are stored");
  if (on_disk()) return;
  dir_ = dir != nullptr ? dir : "";
  fd_ = open_row_file(row_dir(dir_), file_name_);
  heap_ = AlignedVector<float>();
#else
  (void)dir;
  throw InvalidArgument("vectors='disk' needs memory-mapped files, which this platform build lacks");
#endif
}

void RowBuffer::use_mapped(std::shared_ptr<const void> owner, const float* rows, std::size_t n, const char* dir) {
#if defined(KBCORE_HAVE_MMAP)
  if (size() != 0 || on_disk()) throw InvalidArgument("rows can be mapped in place only into an empty buffer");
  dir_ = dir != nullptr ? dir : "";
  heap_ = AlignedVector<float>();
  owner_ = std::move(owner);
  view_ = n != 0 ? rows : nullptr;
  size_ = n;
  if (view_ == nullptr) {  // nothing to read in place: an empty row file
    owner_.reset();
    fd_ = open_row_file(row_dir(dir_), file_name_);
  }
#else
  (void)owner;
  (void)rows;
  (void)n;
  (void)dir;
  throw InvalidArgument("vectors='disk' needs memory-mapped files, which this platform build lacks");
#endif
}

void RowBuffer::materialize() {
#if defined(KBCORE_HAVE_MMAP)
  // Copy the rows read in place into a new row file; on failure the buffer is unchanged.
  std::string name;
  const int fd = open_row_file(row_dir(dir_), name);
  RowBuffer fresh;
  fresh.fd_ = fd;
  fresh.dir_ = dir_;
  fresh.file_name_ = name;
  fresh.remap(size_);
  std::memcpy(fresh.map_, view_, size_ * sizeof(float));
  fresh.size_ = size_;
  *this = std::move(fresh);
  release_resident();
#endif
}

void RowBuffer::remap(std::size_t cap) {
#if defined(KBCORE_HAVE_MMAP)
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::size_t bytes = std::max<std::size_t>(cap * sizeof(float), page);
  bytes = (bytes + page - 1) / page * page;
  const std::size_t old_bytes = map_ != nullptr ? cap_ * sizeof(float) : 0;
  if (const int rc = reserve_file_space(fd_, old_bytes, bytes)) {
    throw IoError("cannot reserve " + std::to_string(bytes) + " bytes for the row file " + file_name_ +
                  " (vectors='disk'; set TMPDIR to a disk with room): " + std::strerror(rc));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) throw IoError("cannot map the row file " + file_name_ + ": " + std::strerror(errno));
  if (map_ != nullptr) ::munmap(map_, cap_ * sizeof(float));
  // Re-ranking reads scattered rows: no read-ahead, and (on kernels that honour it) no
  // fault-around, so a read maps the row's own page rather than its neighbourhood.
  ::madvise(p, bytes, MADV_RANDOM);
  map_ = static_cast<float*>(p);
  cap_ = bytes / sizeof(float);
#else
  (void)cap;
#endif
}

void RowBuffer::reserve(std::size_t n) {
  if (view_ != nullptr) materialize();
  if (!on_disk()) {
    heap_.reserve(n);
    return;
  }
  if (n > cap_) remap(std::max(n, cap_ * 3 / 2));
}

void RowBuffer::resize(std::size_t n) {
  if (view_ != nullptr) materialize();
  if (!on_disk()) {
    heap_.resize(n);
    return;
  }
  reserve(n);
  if (n > size_) std::memset(map_ + size_, 0, (n - size_) * sizeof(float));
  size_ = n;
}

void RowBuffer::assign(AlignedVector<float>&& v) {
#if defined(KBCORE_HAVE_MMAP)
  if (view_ != nullptr) {  // replaced, not copied
    std::string name;
    const int fd = open_row_file(row_dir(dir_), name);
    owner_.reset();
    view_ = nullptr;
    size_ = 0;
    fd_ = fd;
    file_name_ = std::move(name);
  }
#endif
  if (!on_disk()) {
    heap_ = std::move(v);
    return;
  }
  resize(0);
  resize(v.size());
  if (!v.empty()) std::memcpy(map_, v.data(), v.size() * sizeof(float));
  AlignedVector<float>().swap(v);
  release_resident();
}

void RowBuffer::release_resident() const {
#if defined(KBCORE_HAVE_MMAP)
  // MADV_DONTNEED on a shared file mapping unmaps the pages; their contents stay in the page
  // cache / file and are faulted back in on the next read.
  if (map_ != nullptr) ::madvise(map_, cap_ * sizeof(float), MADV_DONTNEED);
  if (view_ != nullptr) {
    // The view starts 64-byte aligned inside a page-aligned file mapping: advise whole pages.
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const auto begin = reinterpret_cast<std::uintptr_t>(view_) / page * page;
    const auto end = reinterpret_cast<std::uintptr_t>(view_ + size_);
    ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
  }
#endif
}

}  // namespace kbcore
