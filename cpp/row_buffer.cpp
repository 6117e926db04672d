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
#include "mapped_array.h"

#if defined(_WIN32)
#ifndef NOMINMAX
#define NOMINMAX
#endif
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <fcntl.h>
#include <io.h>
#include <windows.h>

#include <random>

#include "binary_io.h"
#define KBCORE_HAVE_MMAP 1
#elif defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#define KBCORE_HAVE_MMAP 1
#endif

namespace kbcore {

namespace {

#if defined(_WIN32)
// Windows: the row file is opened with FILE_FLAG_DELETE_ON_CLOSE (it goes with its last handle,
// as an unlinked file does on POSIX) and held as a C runtime descriptor (_open_osfhandle), so
// the buffer's members are the same on every platform. Views are CreateFileMapping /
// MapViewOfFile; release_resident trims the pages from the working set (VirtualUnlock of
// pages that are not locked), which writes dirty ones back to the file first.

HANDLE file_handle(int fd) { return reinterpret_cast<HANDLE>(::_get_osfhandle(fd)); }

std::string win_error(DWORD code) { return "Windows error " + std::to_string(static_cast<unsigned long>(code)); }

std::string utf8_of(const std::wstring& w) {
  if (w.empty()) return std::string();
  const int n = ::WideCharToMultiByte(CP_UTF8, 0, w.data(), static_cast<int>(w.size()), nullptr, 0, nullptr, nullptr);
  std::string out(static_cast<std::size_t>(n > 0 ? n : 0), '\0');
  if (n > 0) ::WideCharToMultiByte(CP_UTF8, 0, w.data(), static_cast<int>(w.size()), &out[0], n, nullptr, nullptr);
  return out;
}

int open_row_file(const std::string& base, std::string& name) {
  std::random_device rd;
  for (int attempt = 0; attempt < 16; ++attempt) {
    name = base + "\\kbcore-rows-" + std::to_string(rd()) + std::to_string(rd());
    const HANDLE h = ::CreateFileW(wide_path(name).c_str(), GENERIC_READ | GENERIC_WRITE, 0, nullptr, CREATE_NEW,
                                   FILE_ATTRIBUTE_TEMPORARY | FILE_FLAG_DELETE_ON_CLOSE, nullptr);
    if (h == INVALID_HANDLE_VALUE) {
      const DWORD code = ::GetLastError();
      if (code == ERROR_FILE_EXISTS) continue;
      throw IoError("cannot create a row file in " + base + ": " + win_error(code));
    }
    const int fd = ::_open_osfhandle(reinterpret_cast<std::intptr_t>(h), _O_RDWR | _O_BINARY);
    if (fd < 0) {
      ::CloseHandle(h);
      throw IoError("cannot create a row file in " + base + ": no file descriptor left");
    }
    return fd;
  }
  throw IoError("cannot create a row file in " + base + ": no free file name");
}

void close_row_file(int fd) { ::_close(fd); }

// Extends the file to `to` bytes: SetEndOfFile allocates the space (a full disk fails here,
// not on a write through the view). Where a live view forbids it (ERROR_USER_MAPPED_FILE),
// CreateFileMapping of the larger size extends the file instead, and fails the same way.
// Returns an empty string or the reason.
std::string reserve_file_space(int fd, std::size_t from, std::size_t to) {
  if (to <= from) return std::string();
  LARGE_INTEGER end;
  end.QuadPart = static_cast<LONGLONG>(to);
  const HANDLE h = file_handle(fd);
  if (!::SetFilePointerEx(h, end, nullptr, FILE_BEGIN) || !::SetEndOfFile(h)) {
    const DWORD code = ::GetLastError();
    if (code != ERROR_USER_MAPPED_FILE) return win_error(code);
  }
  return std::string();
}

// A writable view of the file's first `bytes`, or nullptr with `err` set.
void* map_rows(int fd, std::size_t bytes, std::string& err) {
  const auto size = static_cast<unsigned long long>(bytes);
  const HANDLE mapping = ::CreateFileMappingW(file_handle(fd), nullptr, PAGE_READWRITE, static_cast<DWORD>(size >> 32),
                                              static_cast<DWORD>(size & 0xFFFFFFFFULL), nullptr);
  if (mapping == nullptr) {
    err = win_error(::GetLastError());
    return nullptr;
  }
  void* p = ::MapViewOfFile(mapping, FILE_MAP_ALL_ACCESS, 0, 0, bytes);
  if (p == nullptr) err = win_error(::GetLastError());
  ::CloseHandle(mapping);  // the view keeps the mapping object alive
  return p;
}

void unmap_rows(void* p, std::size_t) { ::UnmapViewOfFile(p); }

void drop_resident(void* p, std::size_t bytes) { (void)::VirtualUnlock(p, bytes); }

void advise_random(void*, std::size_t) {}

std::size_t page_bytes() {
  SYSTEM_INFO info;
  ::GetSystemInfo(&info);
  return static_cast<std::size_t>(info.dwPageSize);
}

std::string row_dir(const std::string& dir) {
  if (!dir.empty()) return dir;
  wchar_t buf[MAX_PATH + 1];
  const DWORD n = ::GetTempPathW(MAX_PATH + 1, buf);
  if (n == 0 || n > MAX_PATH) return ".";
  std::wstring w(buf, n);
  while (!w.empty() && (w.back() == L'\\' || w.back() == L'/')) w.pop_back();
  return utf8_of(w);
}

#elif defined(KBCORE_HAVE_MMAP)
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

void close_row_file(int fd) { ::close(fd); }

// Makes the bytes [from, to) of the file real blocks, so that writing them through a shared
// mapping cannot fail (a sparse page that the full file system cannot back is a SIGBUS).
// Returns an empty string or the reason.
std::string reserve_file_space(int fd, std::size_t from, std::size_t to) {
  if (to <= from) return std::string();
#if defined(__linux__) || defined(__FreeBSD__)
  const int rc = ::posix_fallocate(fd, static_cast<off_t>(from), static_cast<off_t>(to - from));
  if (rc != EINVAL && rc != EOPNOTSUPP) return rc == 0 ? std::string() : std::strerror(rc);
#endif
  // Portable fallback (file systems or systems without fallocate): write the zeros.
  static const char zeros[1 << 16] = {};
  for (std::size_t off = from; off < to;) {
    const std::size_t take = std::min(sizeof(zeros), to - off);
    const ssize_t n = ::pwrite(fd, zeros, take, static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      return std::strerror(errno);
    }
    off += static_cast<std::size_t>(n);
  }
  return std::string();
}

// A shared writable mapping of the file's first `bytes`, or nullptr with `err` set.
void* map_rows(int fd, std::size_t bytes, std::string& err) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    err = std::strerror(errno);
    return nullptr;
  }
  return p;
}

void unmap_rows(void* p, std::size_t bytes) { ::munmap(p, bytes); }

// MADV_DONTNEED on a shared file mapping unmaps the pages; their contents stay in the page
// cache / file and are faulted back in on the next read.
void drop_resident(void* p, std::size_t bytes) { ::madvise(p, bytes, MADV_DONTNEED); }

// Re-ranking reads scattered rows: no read-ahead, and (on kernels that honour it) no
// fault-around, so a read maps the row's own page rather than its neighbourhood.
void advise_random(void* p, std::size_t bytes) { ::madvise(p, bytes, MADV_RANDOM); }

std::size_t page_bytes() { return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)); }

std::string row_dir(const std::string& dir) {
  if (!dir.empty()) return dir;
  const char* env = std::getenv("TMPDIR");
  return env != nullptr && *env ? env : "/tmp";
}
#endif

}  // namespace

RowBuffer::~RowBuffer() {
#if defined(KBCORE_HAVE_MMAP)
  if (map_ != nullptr) unmap_rows(map_, cap_ * sizeof(float));
  if (fd_ >= 0) close_row_file(fd_);
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
      view_(std::exchange(o.view_, nullptr)),
      view_heap_(std::exchange(o.view_heap_, false)) {}

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

void RowBuffer::use_mapped_heap(std::shared_ptr<const void> owner, const float* rows, std::size_t n) {
  if (size() != 0 || on_disk() || view_ != nullptr) {
    throw InvalidArgument("rows can be mapped in place only into an empty buffer");
  }
  if (n == 0) return;
  owner_ = std::move(owner);
  view_ = rows;
  size_ = n;
  view_heap_ = true;
}

void RowBuffer::materialize() {
  if (view_heap_) {
    // Copy the rows read in place to the heap; on failure (bad_alloc) the buffer is unchanged.
    AlignedVector<float> fresh(view_, view_ + size_);
    heap_ = std::move(fresh);
    owner_.reset();
    view_ = nullptr;
    size_ = 0;
    view_heap_ = false;
    return;
  }
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

RowBuffer RowBuffer::gathered(const std::vector<std::uint32_t>& new_to_old, std::size_t row_len) const {
  if (view_ == nullptr || new_to_old.size() * row_len != size_) {
    throw InvalidArgument("rows can be gathered only from rows read in place, one index per row");
  }
  RowBuffer out;
  float* dst = nullptr;
  if (view_heap_) {
    out.heap_.resize(size_);
    dst = out.heap_.data();
  } else {
#if defined(KBCORE_HAVE_MMAP)
    out.dir_ = dir_;
    out.fd_ = open_row_file(row_dir(dir_), out.file_name_);
    out.remap(size_);
    out.size_ = size_;
    dst = out.map_;
#endif
  }
  gather_rows_into(dst, view_, row_len, new_to_old);
  out.release_resident();
  return out;
}

void RowBuffer::remap(std::size_t cap) {
#if defined(KBCORE_HAVE_MMAP)
  const std::size_t page = page_bytes();
  std::size_t bytes = std::max<std::size_t>(cap * sizeof(float), page);
  bytes = (bytes + page - 1) / page * page;
  const std::size_t old_bytes = map_ != nullptr ? cap_ * sizeof(float) : 0;
  const std::string reserved = reserve_file_space(fd_, old_bytes, bytes);
  if (!reserved.empty()) {
    throw IoError("cannot reserve " + std::to_string(bytes) + " bytes for the row file " + file_name_ +
                  " (vectors='disk'; set TMPDIR to a disk with room): " + reserved);
  }
  std::string err;
  void* p = map_rows(fd_, bytes, err);
  if (p == nullptr) throw IoError("cannot map the row file " + file_name_ + ": " + err);
  if (map_ != nullptr) unmap_rows(map_, cap_ * sizeof(float));
  advise_random(p, bytes);
  map_ = static_cast<float*>(p);
  cap_ = bytes / sizeof(float);
#else
  (void)cap;
#endif
}

void RowBuffer::reserve(std::size_t n) {
  if (view_heap_) {  // one copy, into room for n
    AlignedVector<float> fresh;
    fresh.reserve(std::max(n, size_));
    fresh.assign(view_, view_ + size_);
    heap_ = std::move(fresh);
    owner_.reset();
    view_ = nullptr;
    size_ = 0;
    view_heap_ = false;
  }
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
  if (view_heap_) {  // replaced, not copied
    owner_.reset();
    view_ = nullptr;
    size_ = 0;
    view_heap_ = false;
  }
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
  if (map_ != nullptr) drop_resident(map_, cap_ * sizeof(float));
  if (view_ != nullptr && !view_heap_) {  // rows in memory stay resident
    // The view starts 64-byte aligned inside a page-aligned file mapping: advise whole pages.
    const std::size_t page = page_bytes();
    const auto begin = reinterpret_cast<std::uintptr_t>(view_) / page * page;
    const auto end = reinterpret_cast<std::uintptr_t>(view_ + size_);
    drop_resident(reinterpret_cast<void*>(begin), end - begin);
  }
#endif
}

}  // namespace kbcore
