#pragma once
// Half and BFloat16 storage types. Arithmetic happens in float: kiln computes every
// 16-bit op in f32 and rounds the result once, as PyTorch does on the CPU.
#include <cstdint>
#include <cstring>
#include <limits>

namespace kiln {

namespace detail {
inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE binary32 -> binary16, round to nearest even, NaN kept quiet, overflow to Inf.
inline std::uint16_t float_to_half_bits(float f) {
  std::uint32_t x = float_bits(f);
  std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t mag = x & 0x7fffffffu;
  if (mag >= 0x7f800000u) {  // Inf or NaN
    return static_cast<std::uint16_t>(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u | ((mag >> 13) & 0x3ffu) : 0u));
  }
  if (mag >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to Inf
  if (mag < 0x38800000u) {                                                    // result is subnormal or zero
    // Add 0.5 (as float) so the FPU does the round-to-nearest-even shift for us.
    float v = bits_float(mag) + 0.5f;
    return static_cast<std::uint16_t>(sign | (float_bits(v) - 0x3f000000u));
  }
  std::uint32_t odd = (mag >> 13) & 1u;
  mag += 0xc8000fffu + odd;  // rebias exponent (-112 << 23) and round
  return static_cast<std::uint16_t>(sign | (mag >> 13));
}

inline float half_bits_to_float(std::uint16_t h) {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    if (man == 0) return bits_float(sign);
    float v = static_cast<float>(man) * 5.9604644775390625e-08f;  // 2^-24
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

inline std::uint16_t float_to_bf16_bits(float f) {
  std::uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}
inline float bf16_bits_to_float(std::uint16_t b) { return bits_float(static_cast<std::uint32_t>(b) << 16); }
}  // namespace detail

/// IEEE 754 binary16 value (storage type of DType::Float16).
struct Half {
  std::uint16_t bits = 0;
  Half() = default;
  Half(float f) : bits(detail::float_to_half_bits(f)) {}  // NOLINT: implicit like c10::Half
  Half(double d) : Half(static_cast<float>(d)) {}
  Half(int i) : Half(static_cast<float>(i)) {}
  operator float() const { return detail::half_bits_to_float(bits); }  // NOLINT
  static Half from_bits(std::uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
};

/// bfloat16 value (storage type of DType::BFloat16).
struct BFloat16 {
  std::uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) : bits(detail::float_to_bf16_bits(f)) {}  // NOLINT
  BFloat16(double d) : BFloat16(static_cast<float>(d)) {}
  BFloat16(int i) : BFloat16(static_cast<float>(i)) {}
  operator float() const { return detail::bf16_bits_to_float(bits); }  // NOLINT
  static BFloat16 from_bits(std::uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

}  // namespace kiln
