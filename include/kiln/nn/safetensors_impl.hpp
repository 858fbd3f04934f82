#pragma once
// The safetensors reader and writer behind nn/safetensors.hpp: the strict JSON parser, the
// header checks and the file handling. Header-only mode includes it from safetensors.hpp
// (KILN_ENTRY is `inline`); compiled mode compiles it once into kiln::kiln_compiled.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#if defined(_WIN32)
#include <process.h>

#include <filesystem>
#else
#include <sys/stat.h>
#include <unistd.h>
#endif

#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/nn/state_dict.hpp"
#include "kiln/tensor/creation.hpp"

#include "kiln/nn/safetensors.hpp"

namespace kiln::nn {

namespace detail {

// ---- JSON: just what a safetensors header needs, strictly (RFC 8259) -----------------------

/// A parsed JSON value. Objects keep their members in document order (keys are unique).
struct JsonValue {
  enum class Kind { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  std::string text;               // String: the decoded value; Number: the literal as written
  bool integer = false;           // Number: no fraction or exponent, and |value| fits in u64
  bool negative = false;          // Number: written with a leading '-'
  std::uint64_t magnitude = 0;    // Number: |value| when `integer`
  std::vector<JsonValue> items;   // Array: the elements; Object: the members' values
  std::vector<std::string> keys;  // Object: the members' keys
};

/// What a JSON value is, for messages ("an array").
inline const char* json_kind_name(const JsonValue& v) {
  switch (v.kind) {
    case JsonValue::Kind::Null:
      return "null";
    case JsonValue::Kind::Bool:
      return v.boolean ? "true" : "false";
    case JsonValue::Kind::Number:
      return "a number";
    case JsonValue::Kind::String:
      return "a string";
    case JsonValue::Kind::Array:
      return "an array";
    case JsonValue::Kind::Object:
      return "an object";
  }
  return "?";
}

/// A syntax error at byte `offset` of the parsed text.
class JsonError : public std::runtime_error {
 public:
  JsonError(const std::string& what, std::size_t at) : std::runtime_error(what), offset(at) {}
  std::size_t offset;
};

/// The offset of the first byte of `s` that does not start a well-formed UTF-8 sequence
/// (overlong forms, surrogates and code points past U+10FFFF included), or npos.
inline std::size_t invalid_utf8_at(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    std::uint32_t cp = 0;
    if ((c & 0xE0u) == 0xC0u) {
      len = 2;
      cp = c & 0x1Fu;
    } else if ((c & 0xF0u) == 0xE0u) {
      len = 3;
      cp = c & 0x0Fu;
    } else if ((c & 0xF8u) == 0xF0u) {
      len = 4;
      cp = c & 0x07u;
    } else {
      return i;
    }
    if (len > s.size() - i) return i;
    for (std::size_t k = 1; k < len; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0u) != 0x80u) return i;
      cp = (cp << 6) | (d & 0x3Fu);
    }
    const std::uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

/// `s` for an error message: quoted, with control bytes written as \xNN so a name holding a
/// newline cannot break the message apart.
inline std::string quote_name(std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out = "'";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7F) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += ch;
    }
  }
  return out + "'";
}

/// Parses one JSON document (whitespace around it allowed, nothing else). Duplicate keys in an
/// object, lone surrogates, control characters in strings, leading zeros and nesting deeper
/// than kMaxDepth are errors. Expects valid UTF-8 (check with invalid_utf8_at first).
class JsonParser {
 public:
  static constexpr int kMaxDepth = 64;

  explicit JsonParser(std::string_view text) : s_(text) {}

  JsonValue parse_document() {
    skip_ws();
    JsonValue v = parse_value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected " + here() + " after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw JsonError(what, pos_); }
  [[noreturn]] void fail_at(std::size_t at, const std::string& what) const { throw JsonError(what, at); }

  /// The byte at the cursor, for messages.
  std::string here() const {
    if (pos_ >= s_.size()) return "end of text";
    const auto c = static_cast<unsigned char>(s_[pos_]);
    if (c >= 0x21 && c < 0x7F) return std::string("'") + static_cast<char>(c) + "'";
    static constexpr char hex[] = "0123456789abcdef";
    return std::string("byte 0x") + hex[c >> 4] + hex[c & 15];
  }
  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return s_[pos_]; }
  void skip_ws() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r')) ++pos_;
  }
  void expect(char c, const char* context) {
    if (at_end() || peek() != c) fail(std::string("expected '") + c + "' " + context + ", found " + here());
    ++pos_;
  }

  JsonValue parse_value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth) + " levels");
    if (at_end()) fail("unexpected end of text, expected a value");
    switch (peek()) {
      case '{':
        return parse_object(depth);
      case '[':
        return parse_array(depth);
      case '"': {
        JsonValue v;
        v.kind = JsonValue::Kind::String;
        v.text = parse_string();
        return v;
      }
      case 't':
        return parse_literal("true", JsonValue::Kind::Bool, true);
      case 'f':
        return parse_literal("false", JsonValue::Kind::Bool, false);
      case 'n':
        return parse_literal("null", JsonValue::Kind::Null, false);
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return parse_number();
        fail("unexpected " + here() + ", expected a value");
    }
  }

  JsonValue parse_literal(std::string_view word, JsonValue::Kind kind, bool value) {
    if (s_.substr(pos_, word.size()) != word) fail("unexpected " + here() + ", expected a value");
    pos_ += word.size();
    JsonValue v;
    v.kind = kind;
    v.boolean = value;
    return v;
  }

  JsonValue parse_object(int depth) {
    ++pos_;  // '{'
    JsonValue v;
    v.kind = JsonValue::Kind::Object;
    std::set<std::string> seen;
    skip_ws();
    if (!at_end() && peek() == '}') {
      ++pos_;
      return v;
    }
    for (;;) {
      if (at_end() || peek() != '"') fail("expected a string key, found " + here());
      const std::size_t key_at = pos_;
      std::string key = parse_string();
      if (!seen.insert(key).second) fail_at(key_at, "duplicate key " + quote_name(key));
      skip_ws();
      expect(':', "after an object key");
      skip_ws();
      v.items.push_back(parse_value(depth + 1));
      v.keys.push_back(std::move(key));
      skip_ws();
      if (!at_end() && peek() == ',') {
        ++pos_;
        skip_ws();
        continue;
      }
      expect('}', "or ',' after an object member");
      return v;
    }
  }

  JsonValue parse_array(int depth) {
    ++pos_;  // '['
    JsonValue v;
    v.kind = JsonValue::Kind::Array;
    skip_ws();
    if (!at_end() && peek() == ']') {
      ++pos_;
      return v;
    }
    for (;;) {
      v.items.push_back(parse_value(depth + 1));
      skip_ws();
      if (!at_end() && peek() == ',') {
        ++pos_;
        skip_ws();
        continue;
      }
      expect(']', "or ',' after an array element");
      return v;
    }
  }

  std::uint32_t parse_hex4() {
    std::uint32_t cp = 0;
    for (int k = 0; k < 4; ++k) {
      if (at_end()) fail("unterminated \\u escape");
      const char c = peek();
      std::uint32_t d = 0;
      if (c >= '0' && c <= '9')
        d = static_cast<std::uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f')
        d = static_cast<std::uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        d = static_cast<std::uint32_t>(c - 'A' + 10);
      else
        fail("invalid hex digit " + here() + " in a \\u escape");
      cp = cp * 16 + d;
      ++pos_;
    }
    return cp;
  }

  static void append_utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string parse_string() {
    const std::size_t start = pos_;
    ++pos_;  // '"'
    std::string out;
    for (;;) {
      if (at_end()) fail_at(start, "unterminated string");
      const auto c = static_cast<unsigned char>(peek());
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) fail("unescaped control character " + here() + " in a string");
      if (c != '\\') {
        out += static_cast<char>(c);
        ++pos_;
        continue;
      }
      const std::size_t escape_at = pos_;
      ++pos_;
      if (at_end()) fail_at(start, "unterminated string");
      const char e = peek();
      ++pos_;
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          std::uint32_t cp = parse_hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail_at(escape_at, "lone low surrogate in a \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            // A high surrogate must be followed by the low half of the pair.
            if (s_.substr(pos_, 2) != "\\u") fail_at(escape_at, "lone high surrogate in a \\u escape");
            pos_ += 2;
            const std::uint32_t low = parse_hex4();
            if (low < 0xDC00 || low > 0xDFFF) fail_at(escape_at, "lone high surrogate in a \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default:
          --pos_;
          fail("invalid escape '\\' followed by " + here());
      }
    }
  }

  JsonValue parse_number() {
    const std::size_t start = pos_;
    JsonValue v;
    v.kind = JsonValue::Kind::Number;
    if (peek() == '-') {
      v.negative = true;
      ++pos_;
    }
    auto digit = [&] { return !at_end() && peek() >= '0' && peek() <= '9'; };
    if (!digit()) fail("invalid number: expected a digit, found " + here());
    bool fits = true;
    if (peek() == '0') {
      ++pos_;
      if (digit()) fail_at(start, "invalid number: leading zero");
    } else {
      while (digit()) {
        const auto d = static_cast<std::uint64_t>(peek() - '0');
        if (v.magnitude > (UINT64_MAX - d) / 10) fits = false;
        if (fits) v.magnitude = v.magnitude * 10 + d;
        ++pos_;
      }
    }
    bool integral = true;
    if (!at_end() && peek() == '.') {
      ++pos_;
      if (!digit()) fail("invalid number: expected a digit after '.', found " + here());
      while (digit()) ++pos_;
      integral = false;
    }
    if (!at_end() && (peek() == 'e' || peek() == 'E')) {
      ++pos_;
      if (!at_end() && (peek() == '+' || peek() == '-')) ++pos_;
      if (!digit()) fail("invalid number: expected a digit in the exponent, found " + here());
      while (digit()) ++pos_;
      integral = false;
    }
    v.integer = integral && fits;
    v.text = std::string(s_.substr(start, pos_ - start));
    return v;
  }

  std::string_view s_;
  std::size_t pos_ = 0;
};

/// Appends `s` as a JSON string literal, escaped as serde_json (the reference writer) does:
/// '"', '\\' and control characters only (\b \f \n \r \t, else \u00xx in lower-case hex).
inline void append_json_string(std::string& out, std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  out += '"';
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

// ---- the format ------------------------------------------------------------------------------

/// The reference reader's limit on the header: a larger one is taken as a damaged file.
inline constexpr std::uint64_t kMaxSafetensorsHeader = 100'000'000;

/// A safetensors dtype: its name in the header, its size in bits, and kiln's dtype if kiln
/// has one. Listed in the order of the reference's `Dtype` enum, which the writer sorts by.
struct SafetensorsDType {
  const char* name;
  int bits;
  std::optional<DType> kiln;
};

inline const std::vector<SafetensorsDType>& safetensors_dtypes() {
  static const std::vector<SafetensorsDType> table = {
      {"BOOL", 8, DType::Bool},         {"F4", 4, std::nullopt},          {"F6_E2M3", 6, std::nullopt},
      {"F6_E3M2", 6, std::nullopt},     {"U8", 8, std::nullopt},          {"I8", 8, std::nullopt},
      {"F8_E5M2", 8, std::nullopt},     {"F8_E4M3", 8, std::nullopt},     {"F8_E8M0", 8, std::nullopt},
      {"F8_E4M3FNUZ", 8, std::nullopt}, {"F8_E5M2FNUZ", 8, std::nullopt}, {"I16", 16, std::nullopt},
      {"U16", 16, std::nullopt},        {"F16", 16, DType::Float16},      {"BF16", 16, DType::BFloat16},
      {"I32", 32, DType::Int32},        {"U32", 32, std::nullopt},        {"F32", 32, DType::Float32},
      {"C64", 64, std::nullopt},        {"F64", 64, DType::Float64},      {"I64", 64, DType::Int64},
      {"U64", 64, std::nullopt},
  };
  return table;
}

/// The entry of header name `name`, or nullptr.
inline const SafetensorsDType* find_safetensors_dtype(std::string_view name) {
  for (const SafetensorsDType& d : safetensors_dtypes())
    if (name == d.name) return &d;
  return nullptr;
}

/// The header name of kiln's `dtype` and its place in the reference writer's order.
inline std::pair<const char*, std::size_t> safetensors_dtype_of(DType dtype) {
  const std::vector<SafetensorsDType>& table = safetensors_dtypes();
  for (std::size_t i = 0; i < table.size(); ++i)
    if (table[i].kiln == dtype) return {table[i].name, i};
  throw InternalError(std::string("safetensors: no safetensors dtype for ") + dtype_name(dtype));
}

/// The names of the dtypes kiln loads, for messages.
inline std::string kiln_safetensors_dtypes() {
  std::string s;
  for (const SafetensorsDType& d : safetensors_dtypes())
    if (d.kiln) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

/// One tensor of a validated header.
struct SafetensorsEntry {
  std::string name;
  const SafetensorsDType* dtype = nullptr;
  Shape shape;
  std::uint64_t begin = 0, end = 0;
};

/// A validated header: its tensors in data order (by data_offsets, ties by name), the
/// metadata, and where the data buffer starts and how long it is.
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;
  std::uint64_t data_start = 0;
  std::uint64_t data_bytes = 0;
};

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

inline std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// The file-system questions of the reader and writer, answered as std::filesystem does. On
// POSIX by the system calls std::filesystem makes: <filesystem> (with its <chrono>, locales and
// path classes) would cost every file that includes kiln in header-only mode. On Windows by
// std::filesystem, for its wide paths and its rename over an existing file.

/// Whether `path` is a directory (false when it cannot be examined).
inline bool is_directory(const std::string& path) {
#if defined(_WIN32)
  std::error_code ec;
  return std::filesystem::is_directory(path, ec);
#else
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
#endif
}

/// The size of regular file `path`; `ec` is set when it has none (not found, not a regular file).
inline std::uint64_t file_size(const std::string& path, std::error_code& ec) {
#if defined(_WIN32)
  return static_cast<std::uint64_t>(std::filesystem::file_size(path, ec));
#else
  ec.clear();
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    ec.assign(errno, std::generic_category());
    return static_cast<std::uint64_t>(-1);
  }
  if (S_ISREG(st.st_mode)) return static_cast<std::uint64_t>(st.st_size);
  ec = std::make_error_code(S_ISDIR(st.st_mode) ? std::errc::is_a_directory : std::errc::not_supported);
  return static_cast<std::uint64_t>(-1);
#endif
}

/// Renames `from` to `to`, replacing a file there; `ec` is set on failure.
inline void rename_over(const std::string& from, const std::string& to, std::error_code& ec) {
#if defined(_WIN32)
  std::filesystem::rename(from, to, ec);
#else
  ec.clear();
  if (std::rename(from.c_str(), to.c_str()) != 0) ec.assign(errno, std::generic_category());
#endif
}

/// Removes file `path` if it is there.
inline void remove_file(const std::string& path) {
#if defined(_WIN32)
  std::error_code ignored;
  std::filesystem::remove(path, ignored);
#else
  std::remove(path.c_str());
#endif
}

/// "op: 'path': " - the start of every message about the file.
inline std::string file_prefix(const char* op, const std::string& path) {
  return std::string(op) + ": " + quote_name(path) + ": ";
}

/// Opens `path` for reading and returns it with its size in bytes.
inline std::pair<FilePtr, std::uint64_t> open_checkpoint(const std::string& path, const char* op) {
  if (is_directory(path)) throw CheckpointError(file_prefix(op, path) + "is a directory");
  FilePtr f(std::fopen(path.c_str(), "rb"));
  if (!f) throw CheckpointError(file_prefix(op, path) + "cannot open: " + errno_text(errno));
  std::error_code ec;
  const std::uint64_t size = file_size(path, ec);
  if (ec) throw CheckpointError(file_prefix(op, path) + "cannot read its size: " + ec.message());
  return {std::move(f), size};
}

/// Reads exactly `n` bytes, or throws naming what was being read.
inline void read_exact(std::FILE* f, void* dst, std::uint64_t n, const std::string& prefix, const std::string& what) {
  auto* p = static_cast<unsigned char*>(dst);
  while (n > 0) {
    const std::size_t chunk = static_cast<std::size_t>(std::min<std::uint64_t>(n, std::uint64_t{1} << 30));
    const std::size_t got = std::fread(p, 1, chunk, f);
    if (got != chunk)
      throw CheckpointError(prefix + "reading " + what +
                            " failed: " + (std::ferror(f) ? errno_text(errno) : std::string("the file ended early")));
    p += got;
    n -= got;
  }
}

/// a * b, or false on u64 overflow.
inline bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  if (a != 0 && b > UINT64_MAX / a) return false;
  out = a * b;
  return true;
}

/// One tensor's header entry checked on its own: exactly dtype, shape and data_offsets, a known
/// dtype, non-negative integer sizes, offsets whose span is the tensor's size in bytes and that
/// lie inside the data buffer of `data_bytes` bytes.
inline SafetensorsEntry parse_safetensors_entry(const std::string& name, const JsonValue& v, std::uint64_t data_bytes,
                                                const std::string& prefix) {
  const std::string at = prefix + "tensor " + quote_name(name) + ": ";
  if (v.kind != JsonValue::Kind::Object)
    throw CheckpointError(at + "its header entry is " + json_kind_name(v) +
                          ", not an object with dtype, shape and data_offsets");
  const JsonValue* fields[3] = {nullptr, nullptr, nullptr};
  static constexpr const char* kFields[3] = {"dtype", "shape", "data_offsets"};
  for (std::size_t i = 0; i < v.keys.size(); ++i) {
    std::size_t k = 0;
    while (k < 3 && v.keys[i] != kFields[k]) ++k;
    if (k == 3)
      throw CheckpointError(at + "unknown field " + quote_name(v.keys[i]) +
                            " (an entry has exactly dtype, shape and data_offsets)");
    fields[k] = &v.items[i];
  }
  for (std::size_t k = 0; k < 3; ++k)
    if (!fields[k]) throw CheckpointError(at + "missing field '" + kFields[k] + "'");

  SafetensorsEntry e;
  e.name = name;
  const JsonValue& dtype = *fields[0];
  if (dtype.kind != JsonValue::Kind::String)
    throw CheckpointError(at + "dtype is " + json_kind_name(dtype) + ", not a string such as \"F32\"");
  e.dtype = find_safetensors_dtype(dtype.text);
  if (!e.dtype) throw CheckpointError(at + "unknown dtype " + quote_name(dtype.text));

  const JsonValue& shape = *fields[1];
  if (shape.kind != JsonValue::Kind::Array)
    throw CheckpointError(at + "shape is " + json_kind_name(shape) + ", not an array of sizes");
  std::uint64_t numel = 1;
  bool overflow = false;
  for (const JsonValue& d : shape.items) {
    if (d.kind != JsonValue::Kind::Number || !d.integer || (d.negative && d.magnitude != 0))
      throw CheckpointError(at + "shape has the entry " +
                            (d.kind == JsonValue::Kind::Number ? d.text : json_kind_name(d)) +
                            ", not a non-negative integer");
    if (d.magnitude > static_cast<std::uint64_t>(INT64_MAX))
      throw CheckpointError(at + "shape has the size " + d.text + ", larger than int64");
    e.shape.push_back(static_cast<std::int64_t>(d.magnitude));
    if (!checked_mul(numel, d.magnitude, numel)) overflow = true;
  }
  if (std::find(e.shape.begin(), e.shape.end(), 0) != e.shape.end()) {
    numel = 0;
    overflow = false;
  }
  std::uint64_t bits = 0;
  // kiln addresses a tensor's bytes with int64, so that is the bound, not u64.
  if (overflow || !checked_mul(numel, static_cast<std::uint64_t>(e.dtype->bits), bits) ||
      bits / 8 > static_cast<std::uint64_t>(INT64_MAX))
    throw CheckpointError(at + "shape " + e.shape.str() + " of " + e.dtype->name + " has too many elements");
  if (bits % 8 != 0)
    throw CheckpointError(at + "shape " + e.shape.str() + " of " + e.dtype->name + " (" +
                          std::to_string(e.dtype->bits) + " bits each) is not a whole number of bytes");
  const std::uint64_t nbytes = bits / 8;

  const JsonValue& offsets = *fields[2];
  if (offsets.kind != JsonValue::Kind::Array || offsets.items.size() != 2)
    throw CheckpointError(at + "data_offsets is " +
                          (offsets.kind == JsonValue::Kind::Array
                               ? "an array of " + std::to_string(offsets.items.size()) + " elements"
                               : std::string(json_kind_name(offsets))) +
                          ", not [begin, end]");
  for (const JsonValue& o : offsets.items)
    if (o.kind != JsonValue::Kind::Number || !o.integer || (o.negative && o.magnitude != 0))
      throw CheckpointError(at + "data_offsets has the entry " +
                            (o.kind == JsonValue::Kind::Number ? o.text : json_kind_name(o)) +
                            ", not a non-negative integer");
  e.begin = offsets.items[0].magnitude;
  e.end = offsets.items[1].magnitude;
  const std::string span = "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
  if (e.end < e.begin) throw CheckpointError(at + span + " end before they begin");
  if (e.end - e.begin != nbytes)
    throw CheckpointError(at + span + " span " + std::to_string(e.end - e.begin) + " bytes, but shape " +
                          e.shape.str() + " of " + e.dtype->name + " takes " + std::to_string(nbytes) + " bytes");
  if (e.end > data_bytes)
    throw CheckpointError(at + span + " run past the end of the data buffer (" + std::to_string(data_bytes) +
                          " bytes after the header)");
  return e;
}

/// Reads and validates the header of the open checkpoint `f` of `file_size` bytes; leaves the
/// file positioned at the start of the data buffer.
inline SafetensorsHeader read_safetensors_header(std::FILE* f, std::uint64_t file_size, const std::string& path,
                                                 const char* op) {
  const std::string prefix = file_prefix(op, path);
  if (file_size < 8)
    throw CheckpointError(prefix + "the file is " + std::to_string(file_size) +
                          " bytes, too short for the 8-byte header length of a safetensors file");
  unsigned char len_bytes[8];
  read_exact(f, len_bytes, 8, prefix, "the header length");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > kMaxSafetensorsHeader)
    throw CheckpointError(prefix + "the header length is " + std::to_string(n) + " bytes, more than the " +
                          std::to_string(kMaxSafetensorsHeader) +
                          " a safetensors header may have (not a safetensors file?)");
  if (n > file_size - 8)
    throw CheckpointError(prefix + "the header length is " + std::to_string(n) + " bytes, but the file holds only " +
                          std::to_string(file_size - 8) + " bytes after it (truncated, or not a safetensors file?)");
  std::string text(static_cast<std::size_t>(n), '\0');
  read_exact(f, text.data(), n, prefix, "the header");

  SafetensorsHeader h;
  h.data_start = 8 + n;
  h.data_bytes = file_size - h.data_start;
  if (std::size_t bad = invalid_utf8_at(text); bad != std::string_view::npos)
    throw CheckpointError(prefix + "the header is not valid UTF-8 (at byte " + std::to_string(bad) + " of the header)");
  JsonValue root;
  try {
    root = JsonParser(text).parse_document();
  } catch (const JsonError& e) {
    throw CheckpointError(prefix + "the header is not valid JSON: " + e.what() + " (at byte " +
                          std::to_string(e.offset) + " of the header)");
  }
  if (root.kind != JsonValue::Kind::Object)
    throw CheckpointError(prefix + "the header is " + json_kind_name(root) + ", not a JSON object");

  for (std::size_t i = 0; i < root.keys.size(); ++i) {
    const std::string& key = root.keys[i];
    const JsonValue& v = root.items[i];
    if (key == "__metadata__") {
      if (v.kind != JsonValue::Kind::Object)
        throw CheckpointError(prefix + "__metadata__ is " + json_kind_name(v) + ", not an object of strings");
      for (std::size_t k = 0; k < v.keys.size(); ++k) {
        if (v.items[k].kind != JsonValue::Kind::String)
          throw CheckpointError(prefix + "__metadata__ entry " + quote_name(v.keys[k]) + " is " +
                                json_kind_name(v.items[k]) + ", not a string");
        h.metadata.emplace(v.keys[k], v.items[k].text);
      }
      continue;
    }
    h.tensors.push_back(parse_safetensors_entry(key, v, h.data_bytes, prefix));
  }

  // The tensors must tile the data buffer: no overlaps, no holes, nothing after the last.
  std::sort(h.tensors.begin(), h.tensors.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.name < b.name;
  });
  auto span = [](const SafetensorsEntry& e) {
    return "tensor " + quote_name(e.name) + " (data_offsets [" + std::to_string(e.begin) + ", " +
           std::to_string(e.end) + "])";
  };
  std::uint64_t covered = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& e : h.tensors) {
    if (e.begin < covered) throw CheckpointError(prefix + span(e) + " overlaps " + span(*previous));
    if (e.begin > covered)
      throw CheckpointError(prefix + "bytes [" + std::to_string(covered) + ", " + std::to_string(e.begin) +
                            ") of the data buffer belong to no tensor (a hole before " + span(e) +
                            "); safetensors files have none");
    covered = e.end;
    previous = &e;
  }
  if (covered != h.data_bytes)
    throw CheckpointError(prefix + "the last " + std::to_string(h.data_bytes - covered) + " of the " +
                          std::to_string(h.data_bytes) + " bytes of the data buffer belong to no tensor" +
                          (previous ? " (after " + span(*previous) + ")" : std::string(" (the header lists none)")));
  return h;
}

/// Swaps each `width`-byte element of `p` in place (little-endian files on a big-endian host).
inline void byteswap_elements(void* p, std::uint64_t count, std::size_t width) {
  auto* b = static_cast<unsigned char*>(p);
  for (std::uint64_t i = 0; i < count; ++i, b += width) std::reverse(b, b + width);
}

/// Writes `t`'s elements to `f` as the file stores them: row-major, little-endian, bool as one
/// byte 0 or 1. Evaluates `t` and copies it to the host (any device, any layout, lazy or not).
inline void write_tensor_data(std::FILE* f, const Tensor& t, const std::string& prefix, const std::string& name) {
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const std::vector<T> values = t.to_vector<T>();
    if (static_cast<std::int64_t>(values.size()) != t.numel())
      throw InternalError(prefix + "tensor " + quote_name(name) + " gave " + std::to_string(values.size()) +
                          " values for its " + std::to_string(t.numel()) + " elements");
    if (values.empty()) return;
    std::size_t written = 0;
    if constexpr (std::is_same_v<T, bool>) {
      std::vector<unsigned char> bytes(values.size());
      for (std::size_t i = 0; i < values.size(); ++i) bytes[i] = values[i] ? 1 : 0;
      written = std::fwrite(bytes.data(), 1, bytes.size(), f);
    } else if constexpr (std::endian::native == std::endian::big && sizeof(T) > 1) {
      std::vector<T> swapped = values;
      byteswap_elements(swapped.data(), swapped.size(), sizeof(T));
      written = std::fwrite(swapped.data(), sizeof(T), swapped.size(), f);
    } else {
      written = std::fwrite(values.data(), sizeof(T), values.size(), f);
    }
    if (written != values.size())
      throw CheckpointError(prefix + "writing tensor " + quote_name(name) + " failed: " + errno_text(errno));
  });
}

/// A name for the temporary file no other save in this process or another uses at once.
inline std::string temporary_path(const std::string& path) {
  static std::atomic<unsigned long> counter{0};
#if defined(_WIN32)
  const long pid = static_cast<long>(_getpid());
#else
  const long pid = static_cast<long>(::getpid());
#endif
  return path + ".tmp." + std::to_string(pid) + "." + std::to_string(counter.fetch_add(1));
}

/// Flushes `f` to the disk, so the rename that follows publishes complete data even after a
/// power loss (the rename alone only orders it against other processes).
inline bool sync_file(std::FILE* f) {
  if (std::fflush(f) != 0) return false;
#if defined(_WIN32)
  return true;
#else
  return ::fsync(::fileno(f)) == 0;
#endif
}

}  // namespace detail

KILN_ENTRY void save_safetensors(const StateDict& tensors, const std::string& path,
                                 const std::map<std::string, std::string>& metadata) {
  const char* op = "save_safetensors";
  const std::string prefix = detail::file_prefix(op, path);
  struct Item {
    const std::string* name;
    const Tensor* tensor;
    const char* dtype;
    std::size_t order;
  };
  std::vector<Item> items;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__")
      throw CheckpointError(prefix + "a tensor may not be named '__metadata__' (the header's metadata key)");
    if (detail::invalid_utf8_at(name) != std::string_view::npos)
      throw CheckpointError(prefix + "tensor name " + detail::quote_name(name) + " is not valid UTF-8");
    if (!t.defined())
      throw CheckpointError(prefix + "tensor " + detail::quote_name(name) + " is undefined (default-constructed)");
    auto [dtype, order] = detail::safetensors_dtype_of(t.dtype());
    items.push_back({&name, &t, dtype, order});
  }
  for (const auto& [key, value] : metadata)
    if (detail::invalid_utf8_at(key) != std::string_view::npos ||
        detail::invalid_utf8_at(value) != std::string_view::npos)
      throw CheckpointError(prefix + "metadata entry " + detail::quote_name(key) + " is not valid UTF-8");
  // The reference sorts by descending dtype (its enum order), then by name.
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    if (a.order != b.order) return a.order > b.order;
    return *a.name < *b.name;
  });

  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) header += ',';
      first = false;
      detail::append_json_string(header, key);
      header += ':';
      detail::append_json_string(header, value);
    }
    header += '}';
  }
  std::uint64_t offset = 0;
  for (const Item& it : items) {
    if (header.size() > 1) header += ',';
    detail::append_json_string(header, *it.name);
    header += ":{\"dtype\":\"";
    header += it.dtype;
    header += "\",\"shape\":[";
    const Shape& shape = it.tensor->shape();
    for (std::size_t d = 0; d < shape.size(); ++d) header += (d ? "," : "") + std::to_string(shape[d]);
    const auto nbytes = static_cast<std::uint64_t>(it.tensor->numel()) * itemsize(it.tensor->dtype());
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + nbytes) + "]}";
    offset += nbytes;
  }
  header += '}';
  header.append((8 - header.size() % 8) % 8, ' ');
  if (header.size() > detail::kMaxSafetensorsHeader)
    throw CheckpointError(prefix + "the header would be " + std::to_string(header.size()) + " bytes, more than the " +
                          std::to_string(detail::kMaxSafetensorsHeader) + " a safetensors reader accepts");

  const std::string tmp = detail::temporary_path(path);
  detail::FilePtr f(std::fopen(tmp.c_str(), "wb"));
  if (!f)
    throw CheckpointError(prefix + "cannot create the temporary file " + detail::quote_name(tmp) + ": " +
                          detail::errno_text(errno));
  try {
    unsigned char len_bytes[8];
    std::uint64_t n = header.size();
    for (unsigned char& b : len_bytes) {
      b = static_cast<unsigned char>(n & 0xFF);
      n >>= 8;
    }
    if (std::fwrite(len_bytes, 1, 8, f.get()) != 8 ||
        std::fwrite(header.data(), 1, header.size(), f.get()) != header.size())
      throw CheckpointError(prefix + "writing the header failed: " + detail::errno_text(errno));
    for (const Item& it : items) detail::write_tensor_data(f.get(), *it.tensor, prefix, *it.name);
    if (!detail::sync_file(f.get()))
      throw CheckpointError(prefix + "flushing " + detail::quote_name(tmp) + " failed: " + detail::errno_text(errno));
    if (std::fclose(f.release()) != 0)
      throw CheckpointError(prefix + "closing " + detail::quote_name(tmp) + " failed: " + detail::errno_text(errno));
    std::error_code ec;
    detail::rename_over(tmp, path, ec);
    if (ec) throw CheckpointError(prefix + "renaming " + detail::quote_name(tmp) + " over it failed: " + ec.message());
  } catch (...) {
    f.reset();
    detail::remove_file(tmp);
    throw;
  }
}

KILN_ENTRY StateDict load_safetensors(const std::string& path, Device device) {
  const char* op = "load_safetensors";
  const std::string prefix = detail::file_prefix(op, path);
  auto [file, size] = detail::open_checkpoint(path, op);
  const detail::SafetensorsHeader h = detail::read_safetensors_header(file.get(), size, path, op);
  for (const detail::SafetensorsEntry& e : h.tensors)
    if (!e.dtype->kiln)
      throw CheckpointError(prefix + "tensor " + detail::quote_name(e.name) + " has dtype " + e.dtype->name +
                            ", which kiln has no dtype for (kiln loads " + detail::kiln_safetensors_dtypes() + ")");
  StateDict out;
  for (const detail::SafetensorsEntry& e : h.tensors) {
    const DType dtype = *e.dtype->kiln;
    Tensor host = empty(e.shape, dtype, Device::cpu());
    const std::uint64_t nbytes = e.end - e.begin;
    if (nbytes > 0) {
      void* dst = visit_dtype(dtype, [&](auto tag) -> void* { return host.data_ptr<decltype(tag)>(); });
      detail::read_exact(file.get(), dst, nbytes, prefix, "tensor " + detail::quote_name(e.name));
      if (dtype == DType::Bool) {
        // A bool must be stored as 0 or 1; other bytes would be undefined behaviour to read.
        auto* b = static_cast<unsigned char*>(dst);
        for (std::uint64_t i = 0; i < nbytes; ++i) b[i] = b[i] != 0 ? 1 : 0;
      } else if constexpr (std::endian::native == std::endian::big) {
        detail::byteswap_elements(dst, nbytes / itemsize(dtype), itemsize(dtype));
      }
    }
    out.insert(e.name, device == Device::cpu() ? host : host.to(device));
  }
  return out;
}

KILN_ENTRY std::map<std::string, std::string> safetensors_metadata(const std::string& path) {
  const char* op = "safetensors_metadata";
  auto [file, size] = detail::open_checkpoint(path, op);
  return detail::read_safetensors_header(file.get(), size, path, op).metadata;
}

KILN_ENTRY void save(const StateDict& tensors, const std::string& path) { save_safetensors(tensors, path); }

KILN_ENTRY StateDict load(const std::string& path) { return load_safetensors(path); }

}  // namespace kiln::nn
