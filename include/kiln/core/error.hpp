#pragma once
// Typed errors. Each carries the message a user needs to fix the call: the op, the shapes,
// the dtypes (and for compile errors the source path and the compiler's log).
#include <stdexcept>
#include <string>

namespace kiln {

/// Base of every error kiln throws.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// Shapes that do not broadcast, bad axes, bad reshape sizes, out-of-range slices.
class ShapeError : public Error {
 public:
  using Error::Error;
};

/// A dtype an op does not accept (e.g. `mean` of an integer tensor, `&&` of floats).
class DTypeError : public Error {
 public:
  using Error::Error;
};

/// Generated source failed to compile; the message holds the compiler log and source path.
class CompileError : public Error {
 public:
  CompileError(const std::string& what, std::string log = {}, std::string source_path = {})
      : Error(what), log_(std::move(log)), source_path_(std::move(source_path)) {}
  /// The compiler's diagnostic output.
  const std::string& log() const { return log_; }
  /// Where the generated source was written (empty if it was not).
  const std::string& source_path() const { return source_path_; }

 private:
  std::string log_;
  std::string source_path_;
};

/// An index outside its dimension: a class target outside [0, C), a gather index.
class IndexError : public Error {
 public:
  using Error::Error;
};

/// An argument whose value, not its shape or dtype, is invalid (a null data pointer).
class ValueError : public Error {
 public:
  using Error::Error;
};

/// A gradient request the recorded graph cannot answer: a backward of a tensor that needs no
/// grad, of a non-scalar without a gradient, through a graph a backward already freed.
class AutogradError : public Error {
 public:
  using Error::Error;
};

/// A "cannot happen" state inside kiln: a bug to report, never the user's mistake.
class InternalError : public Error {
 public:
  using Error::Error;
};

/// Work on a device that is absent or unusable, or tensors on different devices in one op.
class DeviceError : public Error {
 public:
  using Error::Error;
};

/// Memory that cannot be had on a device: a request larger than it (or the address space)
/// holds. The message names the op, the shape, the dtype and the bytes asked for.
class OutOfMemoryError : public DeviceError {
 public:
  using DeviceError::DeviceError;
};

/// A checkpoint file that cannot be written or read: a malformed safetensors header (bad JSON,
/// missing or extra fields, offsets that do not tile the data), a dtype kiln lacks, an I/O
/// failure. The message names the operation, the file, the tensor and what is wrong.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

/// A collective that cannot complete: another rank failed, timed out or called a different
/// collective; the process group cannot be reached or set up (no NCCL, a rendezvous that timed
/// out). The message names the collective, the ranks and what went wrong.
class DistributedError : public Error {
 public:
  using Error::Error;
};

}  // namespace kiln
