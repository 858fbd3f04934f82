#pragma once
// Mixed precision, as torch.autocast. While an AutocastGuard lives (per thread, nesting), the
// front end casts the inputs of some ops as it records them: matrix products to a 16-bit float,
// ops that need float32's range (exp, log, pow, softmax, sums, norms, losses) to float32, and
// a few multi-input ops to their widest input. The casts are ordinary Cast nodes, decided when
// the op is called, so autodiff differentiates them (an f32 leaf gets an f32 gradient) and
// kiln::compile guards on the state (compile/compile.hpp). Which op is in which class is in
// the ops' own headers (expr.hpp's autocast_class, the calls of autocast_cast) and in
// docs/semantics.md, "Mixed precision (autocast)".
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "kiln/core/device.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/linkage.hpp"
#include "kiln/tensor/tensor.hpp"

namespace kiln {

namespace detail {

/// How autocast treats an op (torch's CastPolicy). None: the inputs' dtype. LowerPrecision:
/// f16/bf16/f32 inputs cast to the autocast dtype (f64 and integers left alone). Fp32: f16/bf16
/// inputs cast to float32. Promote: f16/bf16/f32 inputs cast to the widest of them.
enum class AutocastClass : std::uint8_t { None, LowerPrecision, Fp32, Promote };

inline constexpr std::size_t kAutocastKinds = 2;  // Device::Kind::CPU, Device::Kind::CUDA

/// The thread's autocast state: per device kind, on or off and the lower-precision dtype.
struct AutocastState {
  std::array<bool, kAutocastKinds> enabled{false, false};
  std::array<DType, kAutocastKinds> dtype{DType::BFloat16, DType::Float16};  // torch's defaults
  DType last = DType::BFloat16;  ///< the dtype the innermost live guard set (get_autocast_dtype())
};

inline thread_local AutocastState autocast_tls;

inline std::size_t autocast_kind(Device::Kind k) { return static_cast<std::size_t>(k); }

/// Whether autocast applies to ops on `device` now.
KILN_ENTRY bool autocast_on(Device device);

/// torch's is_eligible: a floating tensor that is not float64.
constexpr bool autocast_eligible(DType t) { return is_floating(t) && t != DType::Float64; }

/// The dtype autocast gives an input of dtype `t` on `device` for an op of class `c` (`t` when
/// autocast leaves it; Promote is decided over all inputs, see autocast_promote).
KILN_ENTRY DType autocast_target(AutocastClass c, DType t, Device device);

/// `t` as autocast gives it to an op of class `c` (a Cast node, or `t` itself). Undefined
/// tensors (an absent bias) stay undefined.
KILN_ENTRY Tensor autocast_cast(const Tensor& t, AutocastClass c);

/// torch's promote policy over the tensors `ts` (in place): where autocast is on for some
/// eligible input, every eligible input is cast to float32 if one of them is float32 (or the
/// two 16-bit types meet), else to the autocast dtype. f64 and integer inputs are left alone.
KILN_ENTRY void autocast_promote(std::initializer_list<Tensor*> ts);

/// The state as one word (0: off everywhere), for guards: per device kind, on and its dtype.
/// The dtype of a kind that is off is left out (it changes nothing).
KILN_ENTRY std::uint32_t autocast_key();

/// "off", or e.g. "cpu: bfloat16, cuda: off" (for logs).
KILN_ENTRY std::string autocast_describe();

/// Autocast off while it lives: the body of an op whose inputs autocast already cast (torch
/// runs it with the autocast dispatch key excluded), so its inner ops keep those dtypes.
class AutocastSuspend {
 public:
  AutocastSuspend() : saved_(autocast_tls) { autocast_tls.enabled.fill(false); }
  ~AutocastSuspend() { autocast_tls = saved_; }
  AutocastSuspend(const AutocastSuspend&) = delete;
  AutocastSuspend& operator=(const AutocastSuspend&) = delete;

 private:
  AutocastState saved_;
};

}  // namespace detail

/// Mixed precision while it lives, as torch.autocast: matrix products (matmul, mm, bmm, addmm,
/// linear, einsum) cast their floating inputs to `dtype` (f64 stays f64); ops that need
/// float32's range (exp, log, pow, softmax, log_softmax, sum, prod, cumsum, logsumexp,
/// layer_norm, rms_norm, cross_entropy, ...) cast f16/bf16 inputs to float32; scatter_add runs
/// in its widest input; every other op runs in its inputs' dtype. Without a device it applies to
/// tensors on every device, with one only to ops whose inputs are on that kind of device
/// (torch.autocast(device_type=...)). Per thread; guards nest, and each restores the state it
/// found. `enabled = false` turns autocast off in its scope (torch.autocast(enabled=False));
/// dtype float32 means off as well. `dtype` must be float16, bfloat16 or float32 (else
/// DTypeError). Casts are recorded graph nodes: gradients flow through them to float32
/// parameters as float32, and kiln::compile re-traces when the state differs from a trace's.
///
///     kiln::AutocastGuard amp(kiln::bf16);
///     Tensor y = linear(x, w, b);          // bfloat16
///     Tensor loss = cross_entropy(y, t);   // float32
class AutocastGuard {
 public:
  /// Autocast to `dtype` for tensors on every device.
  explicit AutocastGuard(DType dtype = DType::BFloat16, bool enabled = true) : saved_(detail::autocast_tls) {
    check(dtype);
    for (std::size_t k = 0; k < detail::kAutocastKinds; ++k) set(k, dtype, enabled);
    detail::autocast_tls.last = dtype;
  }
  /// Autocast to `dtype` for ops on devices of kind `device_type` only (others keep their state).
  AutocastGuard(Device::Kind device_type, DType dtype, bool enabled = true) : saved_(detail::autocast_tls) {
    check(dtype);
    const std::size_t k = detail::autocast_kind(device_type);
    if (k >= detail::kAutocastKinds) throw ValueError("AutocastGuard: unknown device kind");
    set(k, dtype, enabled);
    detail::autocast_tls.last = dtype;
  }
  /// As above, for the kind of `device` (its index is not looked at, as torch.autocast's device_type).
  AutocastGuard(Device device, DType dtype, bool enabled = true) : AutocastGuard(device.kind, dtype, enabled) {}
  ~AutocastGuard() { detail::autocast_tls = saved_; }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  static void check(DType dtype) {
    if (dtype != DType::Float16 && dtype != DType::BFloat16 && dtype != DType::Float32)
      throw DTypeError(std::string("AutocastGuard: expected float16, bfloat16 or float32 (off), got ") +
                       dtype_name(dtype));
  }
  static void set(std::size_t k, DType dtype, bool enabled) {
    detail::autocast_tls.dtype[k] = dtype;
    detail::autocast_tls.enabled[k] = enabled && dtype != DType::Float32;
  }
  detail::AutocastState saved_;
};

/// Whether autocast is on for some device in this thread (torch.is_autocast_enabled()).
inline bool is_autocast_enabled() { return detail::autocast_key() != 0; }
/// Whether autocast is on for devices of kind `device_type` (torch.is_autocast_enabled(device_type)).
inline bool is_autocast_enabled(Device::Kind device_type) { return detail::autocast_on(Device{device_type, 0}); }

/// The dtype the innermost live AutocastGuard set (bfloat16 when none), as torch.get_autocast_dtype.
inline DType get_autocast_dtype() { return detail::autocast_tls.last; }
/// The lower-precision dtype for devices of kind `device_type`: the one a guard set for it, else
/// torch's default (bfloat16 on the CPU, float16 on CUDA).
KILN_ENTRY DType get_autocast_dtype(Device::Kind device_type);

}  // namespace kiln

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/tensor/autocast_impl.hpp"
#endif
