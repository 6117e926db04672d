#pragma once
// The typed error hierarchy of the native core. The Python binding maps each class
// to a kbcore.errors class that also subclasses the matching builtin.
#include <stdexcept>
#include <string>

namespace kbcore {

/// Base of every error thrown by the core.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The caller passed a value the operation cannot accept (maps to ValueError).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// An id or key that the operation needs is not present (maps to KeyError).
class NotFound : public Error {
 public:
  using Error::Error;
};

/// A persisted file is truncated, corrupted or of an unknown format version (maps to OSError).
class FormatError : public Error {
 public:
  using Error::Error;
};

/// The operating system refused a file operation (maps to OSError).
class IoError : public Error {
 public:
  using Error::Error;
};

}  // namespace kbcore
