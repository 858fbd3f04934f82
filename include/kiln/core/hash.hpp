#pragma once
// 64-bit hashing for structural keys (graph nodes, guards, cache entries).
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace kiln::detail {

constexpr std::uint64_t hash_mix(std::uint64_t x) {
  // splitmix64 finaliser: cheap and well distributed.
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

constexpr std::uint64_t hash_combine(std::uint64_t seed, std::uint64_t v) {
  return hash_mix(seed ^ (v + 0x9e3779b97f4a7c15ull + (seed << 6) + (seed >> 2)));
}

constexpr std::uint64_t hash_string(std::string_view s, std::uint64_t seed = 0xcbf29ce484222325ull) {
  std::uint64_t h = seed;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;  // FNV-1a
  return hash_mix(h);
}

inline std::uint64_t hash_double(double d) {
  std::uint64_t u;
  std::memcpy(&u, &d, 8);
  return hash_mix(u);
}

/// 64-bit FNV-1a over bytes (checksums of cache entries).
inline std::uint64_t hash_bytes(const void* data, std::size_t n, std::uint64_t seed = 0xcbf29ce484222325ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t h = seed;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

/// "00ab12..." : 16 lowercase hex digits of `v`, the spelling of keys in logs and file names.
inline std::string hex64(std::uint64_t v) {
  static const char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = digits[v & 15];
  return s;
}

}  // namespace kiln::detail
