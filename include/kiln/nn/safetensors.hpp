#pragma once
// safetensors checkpoints (https://github.com/huggingface/safetensors), read and written the
// way the reference implementation does, so files move between kiln and PyTorch, JAX or MLX.
//
// A file is: 8 bytes little-endian u64 N, N bytes of UTF-8 JSON (the header), then the data
// buffer. The header is an object mapping each tensor's name to {"dtype", "shape",
// "data_offsets": [begin, end]} (offsets into the data buffer), plus an optional
// "__metadata__" object of strings. Data is little-endian, row-major, contiguous.
//
// Reading trusts nothing: the header is parsed by a small strict JSON parser (no third-party
// library) and checked completely (fields, dtypes, shapes, sizes, and that the tensors tile
// the data buffer exactly, as the reference reader requires) before any tensor is allocated.
// Writing goes to a temporary file renamed over the target, so a crash or an error never
// leaves a half-written checkpoint and an existing one stays as it was.
#include <concepts>
#include <map>
#include <string>

#include "kiln/backend/entry.hpp"
#include "kiln/core/device.hpp"
#include "kiln/nn/state_dict.hpp"

namespace kiln::nn {

namespace detail {

template <class M>
concept HasStateDict = requires(const M& m) {
  { m.state_dict() } -> std::convertible_to<StateDict>;
};

template <class M>
concept LoadsStateDict = HasStateDict<M> && requires(M& m, const StateDict& sd, bool strict) {
  m.load_state_dict(sd, strict);
};

}  // namespace detail

/// Writes `tensors` to `path` as a safetensors file, as the reference writer (Python's
/// `safetensors.torch.save_file`) does, byte for byte: entries and data sorted by dtype (the
/// reference's order: I64, F64, F32, I32, BF16, F16, BOOL), then by name; the header padded
/// with spaces to a multiple of 8 bytes. `metadata`, when not empty, is written as
/// "__metadata__" first, its keys sorted. Tensors may be on any device, strided or lazy: each
/// is evaluated and copied to the host in turn. The file is written to a temporary beside
/// `path` and renamed over it, so on any error (a CheckpointError for I/O and for undefined
/// tensors or a tensor named "__metadata__"; an evaluation's own error otherwise) `path` is
/// left as it was and no temporary remains.
KILN_ENTRY void save_safetensors(const StateDict& tensors, const std::string& path,
                                 const std::map<std::string, std::string>& metadata = {});

/// Reads the safetensors file `path` into tensors on `device`, in the file's data order
/// (ascending data_offsets, which for files the reference writes is dtype-then-name order;
/// ties between empty tensors by name). The whole header is validated before any tensor is
/// allocated; a malformed file (truncated, a bad header length, JSON that is not valid or not
/// an object, missing or extra fields, an unknown dtype, negative sizes, offsets that do not
/// match the shape, leave the buffer or do not tile it exactly, duplicate names) or a dtype
/// kiln lacks (I8, U8, I16, U16, U32, U64, the 8-bit and smaller floats, C64) is a
/// CheckpointError naming the file, the tensor and what is wrong. Bool bytes other than 0
/// read as true.
KILN_ENTRY StateDict load_safetensors(const std::string& path, Device device = Device::cpu());

/// The "__metadata__" of the safetensors file `path` (empty if it has none). The header is
/// validated as load_safetensors does, except that tensors of dtypes kiln lacks are allowed.
KILN_ENTRY std::map<std::string, std::string> safetensors_metadata(const std::string& path);

/// Writes `tensors` to `path` as a safetensors file (save_safetensors without metadata).
KILN_ENTRY void save(const StateDict& tensors, const std::string& path);

/// Reads the safetensors file `path` into CPU tensors (load_safetensors).
KILN_ENTRY StateDict load(const std::string& path);

/// Writes `module.state_dict()` to `path` as a safetensors file.
template <class M>
requires detail::HasStateDict<M>
void save(const M& module, const std::string& path) { save_safetensors(module.state_dict(), path); }

/// Reads the safetensors file `path` onto the device of the module's first state tensor (the
/// CPU if it has none) and hands it to `module.load_state_dict(tensors, strict)`. A malformed
/// file throws before the module is touched.
template <class M>
requires detail::LoadsStateDict<M>
void load(M& module, const std::string& path, bool strict = true) {
  Device device = Device::cpu();
  const StateDict current = module.state_dict();
  if (!current.empty() && current.begin()->second.defined()) device = current.begin()->second.device();
  const StateDict tensors = load_safetensors(path, device);
  module.load_state_dict(tensors, strict);
}

}  // namespace kiln::nn

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/nn/safetensors_impl.hpp"
#endif
