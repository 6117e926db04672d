// RowBuffer (row_buffer.h): heap rows, or rows in a shared mapping of an unlinked temp file.
#include "row_buffer.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

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
      cap_(std::exchange(o.cap_, 0)) {}

RowBuffer& RowBuffer::operator=(RowBuffer&& o) noexcept {
  if (this != &o) {
    this->~RowBuffer();
    new (this) RowBuffer(std::move(o));
  }
  return *this;
}

void RowBuffer::use_disk(const char* dir) {
#if defined(KBCORE_HAVE_MMAP)
  if (size() != 0) throw InvalidArgument("vectors='disk' must be chosen before rows are stored");
  if (on_disk()) return;
  std::string base = dir != nullptr && *dir ? dir : (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
  std::string tmpl = base + "/kbcore-rows-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  const int fd = ::mkstemp(buf.data());
  if (fd < 0) throw IoError("cannot create a row file in " + base + ": " + std::strerror(errno));
  ::unlink(buf.data());  // the file lives as long as the descriptor
  fd_ = fd;
  heap_ = AlignedVector<float>();
#else
  (void)dir;
  throw InvalidArgument("vectors='disk' needs memory-mapped files, which this platform build lacks");
#endif
}

void RowBuffer::remap(std::size_t cap) {
#if defined(KBCORE_HAVE_MMAP)
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::size_t bytes = std::max<std::size_t>(cap * sizeof(float), page);
  bytes = (bytes + page - 1) / page * page;
  if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0) {
    throw IoError(std::string("cannot grow the row file: ") + std::strerror(errno));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) throw IoError(std::string("cannot map the row file: ") + std::strerror(errno));
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
  if (!on_disk()) {
    heap_.reserve(n);
    return;
  }
  if (n > cap_) remap(std::max(n, cap_ * 3 / 2));
}

void RowBuffer::resize(std::size_t n) {
  if (!on_disk()) {
    heap_.resize(n);
    return;
  }
  reserve(n);
  if (n > size_) std::memset(map_ + size_, 0, (n - size_) * sizeof(float));
  size_ = n;
}

void RowBuffer::assign(AlignedVector<float>&& v) {
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
#endif
}

}  // namespace kbcore
