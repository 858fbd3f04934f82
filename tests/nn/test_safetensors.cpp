// safetensors checkpoints: every dtype kiln has round-trips bit for bit (0-d, empty, strided
// and lazy sources included) on the device under test; a small file comes out byte for byte as
// the reference writer (Python's safetensors) writes it; a hand-built Python-style header
// (metadata, keys out of data order, whitespace, escapes) loads; every malformed header is a
// CheckpointError naming the file, the tensor and the fault; a failed save leaves the old file
// and no temporary; save/load through a module-like type.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

#include <kiln/kiln.hpp>
#include <kiln/nn/safetensors.hpp>

#include "../support/device.hpp"

namespace kiln_test_nn_safetensors {

using namespace kiln;
using kiln::testing::device;  // KILN_DEVICE: the same tests on the CPU and on a GPU
namespace fs = std::filesystem;

namespace {

/// A fresh directory under the system's temporary directory, removed with its contents.
struct TempDir {
  fs::path path;
  TempDir() {
    static int count = 0;
    path = fs::temp_directory_path() /
           ("kiln_test_safetensors_" + std::to_string(::getpid()) + "_" + std::to_string(count++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
  /// The names in the directory, sorted.
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(path)) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

/// 8 bytes little-endian `n`.
std::string u64_le(std::uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out;
}

/// A safetensors file: the header's length, the header, then `data`.
std::string st_file(const std::string& header, const std::string& data) {
  return u64_le(header.size()) + header + data;
}

/// A tensor's elements as the file stores them (row-major, little-endian, bool as 0/1 bytes).
std::string bytes_of(const Tensor& t) {
  return visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> v = t.to_vector<T>();
    std::string out;
    if constexpr (std::is_same_v<T, bool>) {
      for (bool b : v) out += static_cast<char>(b ? 1 : 0);
    } else {
      out.resize(v.size() * sizeof(T));
      if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
    }
    return out;
  });
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

/// Loading `path` throws a CheckpointError whose message names the op, the file and each of
/// `needles`; so does reading its metadata unless `metadata_ok` (a valid file whose dtype kiln
/// lacks).
void check_rejected(const std::string& path, const std::vector<std::string>& needles, bool metadata_ok = false) {
  std::string message;
  try {
    nn::StateDict sd = nn::load_safetensors(path, device());
    FAIL_CHECK("load_safetensors accepted it and returned " << sd.size() << " tensors");
  } catch (const CheckpointError& e) {
    message = e.what();
  }
  INFO("message: " << message);
  CHECK(contains(message, "load_safetensors: '" + path + "': "));
  for (const std::string& n : needles) CHECK_MESSAGE(contains(message, n), "missing '" << n << "'");
  if (metadata_ok) {
    CHECK_NOTHROW(nn::safetensors_metadata(path));
  } else {
    CHECK_THROWS_AS(nn::safetensors_metadata(path), CheckpointError);
  }
}

/// Writes `bytes` as a file and checks that it is rejected with `needles` in the message.
void check_rejected_bytes(const TempDir& dir, const std::string& what, const std::string& bytes,
                          const std::vector<std::string>& needles, bool metadata_ok = false) {
  INFO("case: " << what);
  const std::string path = dir.file("bad.safetensors");
  write_bytes(path, bytes);
  check_rejected(path, needles, metadata_ok);
}

/// A header with its data buffer of `data_bytes` zero bytes.
std::string with_zeros(const std::string& header, std::size_t data_bytes) {
  return st_file(header, std::string(data_bytes, '\0'));
}

/// Stands in for nn::Module: just the two members save/load use.
struct MockModule {
  Tensor weight, bias;
  int loads = 0;
  bool last_strict = false;
  nn::StateDict state_dict() const {
    nn::StateDict sd;
    sd.insert("weight", weight);
    sd.insert("bias", bias);
    return sd;
  }
  void load_state_dict(const nn::StateDict& sd, bool strict = true) {
    ++loads;
    last_strict = strict;
    if (strict && sd.size() != 2) throw ValueError("MockModule: expected exactly weight and bias");
    weight = sd.at("weight");
    bias = sd.at("bias");
  }
};

static_assert(nn::detail::LoadsStateDict<MockModule>);
static_assert(!nn::detail::HasStateDict<nn::StateDict>, "save(StateDict) must take the StateDict overload");

}  // namespace

TEST_CASE("safetensors: every kiln dtype round-trips bit for bit, 0-d, empty, strided and lazy sources included") {
  TempDir dir;
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const float finf = std::numeric_limits<float>::infinity();
  nn::StateDict sd;
  sd.insert("f64", from_vector<double>({1.5, -0.0, inf, nan, 4.9e-324, -2.25}, {2, 3}, device()));
  sd.insert("f32", from_vector<float>({0.1f, -finf, 1e-45f, 3.4e38f, -0.0f, 7.0f}, {3, 2}, device()));
  sd.insert("f16", from_vector<Half>({Half(1.0f), Half(-2.5f), Half(65504.0f), Half::from_bits(0x0001),
                                      Half::from_bits(0x7C00), Half::from_bits(0x8000)},
                                     {6}, device()));
  sd.insert("bf16", from_vector<BFloat16>({BFloat16(1.0f), BFloat16(-3.0f), BFloat16(1e30f), BFloat16(0.1f)}, {2, 2},
                                          device()));
  sd.insert("i64", from_vector<std::int64_t>(
                       {std::numeric_limits<std::int64_t>::min(), -1, 0, std::numeric_limits<std::int64_t>::max()},
                       {2, 2}, device()));
  sd.insert("i32", from_vector<std::int32_t>(
                       {std::numeric_limits<std::int32_t>::min(), 7, std::numeric_limits<std::int32_t>::max()}, {3},
                       device()));
  sd.insert("bool", from_vector<bool>({true, false, true, true}, {4}, device()));
  sd.insert("scalar", from_vector<float>({4.5f}, Shape{}, device()));
  sd.insert("empty", zeros({0, 3}, f32, device()));
  sd.insert("empty_i64", zeros({4, 0}, i64, device()));
  Tensor base = from_vector<std::int32_t>({1, 2, 3, 4, 5, 6}, {2, 3}, device());
  base.eval();
  Tensor transposed = transpose(base, 0, 1);
  REQUIRE_FALSE(transposed.is_contiguous());
  sd.insert("transposed", transposed);
  Tensor lazy = from_vector<float>({1, 2, 3}, {3}, device()) * 2.0f + 1.0f;
  sd.insert("lazy", lazy);

  const std::string path = dir.file("all.safetensors");
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"epoch", "3"}, {"note \"q\"", "tab\there, newline\n, \x01, caf\xc3\xa9, \\ /"}};
  nn::save_safetensors(sd, path, metadata);
  CHECK(dir.listing() == std::vector<std::string>{"all.safetensors"});  // no temporary left behind
  nn::StateDict back = nn::load_safetensors(path, device());

  REQUIRE(back.size() == sd.size());
  for (const auto& [name, original] : sd) {
    INFO("tensor " << name);
    const Tensor* got = back.find(name);
    REQUIRE(got != nullptr);
    CHECK(got->dtype() == original.dtype());
    CHECK(got->shape() == original.shape());
    CHECK(got->device() == device());
    CHECK(bytes_of(*got) == bytes_of(original));
  }
  CHECK(back["transposed"].to_vector<std::int32_t>() == std::vector<std::int32_t>{1, 4, 2, 5, 3, 6});
  CHECK(back["lazy"].to_vector<float>() == std::vector<float>{3, 5, 7});
  CHECK(back["scalar"].dim() == 0);
  CHECK(back["bool"].to_vector<bool>() == std::vector<bool>{true, false, true, true});
  const std::vector<double> f64 = back["f64"].to_vector<double>();
  CHECK(std::signbit(f64[1]));
  CHECK(std::isnan(f64[3]));
  CHECK(f64[4] == 4.9e-324);

  // Data order, as the reference writes it: by dtype (I64, F64, F32, I32, BF16, F16, BOOL),
  // then by name; empty tensors sit at their offset.
  CHECK(back.keys() == std::vector<std::string>{"empty_i64", "i64", "f64", "empty", "f32", "lazy", "scalar", "i32",
                                                "transposed", "bf16", "f16", "bool"});
  CHECK(nn::safetensors_metadata(path) == metadata);

  // The same tensors written again give the same bytes.
  const std::string again = dir.file("again.safetensors");
  nn::save_safetensors(sd, again, metadata);
  CHECK(read_bytes(again) == read_bytes(path));

  // An empty StateDict is a valid file too.
  const std::string none = dir.file("none.safetensors");
  nn::save_safetensors(nn::StateDict{}, none);
  CHECK(read_bytes(none) == u64_le(8) + "{}      ");
  CHECK(nn::load_safetensors(none).empty());
  CHECK(nn::safetensors_metadata(none).empty());
}

TEST_CASE("safetensors: a small file is byte for byte what Python's safetensors writes") {
  TempDir dir;
  nn::StateDict sd;
  sd.insert("b", from_vector<float>({1.0f, 2.0f}, {2}, device()));
  sd.insert("a", from_vector<std::int64_t>({7}, {1}, device()));
  sd.insert("c", from_vector<Half>({Half(1.5f)}, {1}, device()));
  sd.insert("d", from_vector<bool>({true, false}, {2}, device()));
  sd.insert("e", zeros({2, 0}, f64, device()));
  sd.insert("f", from_vector<double>({3.0}, Shape{}, device()));
  sd.insert("g", from_vector<std::int32_t>({-2}, {1}, device()));
  sd.insert("h", from_vector<BFloat16>({BFloat16(-1.0f)}, {1}, device()));
  sd.insert("w\"\n\x01\xc3\xa9/", from_vector<std::int32_t>({1}, {1}, device()));

  // What safetensors.serialize(..., metadata={"format": "pt"}) returns for these tensors
  // (safetensors 0.8): entries sorted by dtype then name, "__metadata__" first, compact JSON
  // escaped as serde_json escapes ('"', '\\', control characters; é as UTF-8, '/' as is),
  // padded with spaces to 544 = 68 * 8 bytes.
  const std::string header = R"({"__metadata__":{"format":"pt"},)"
                             R"("a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
                             R"("e":{"dtype":"F64","shape":[2,0],"data_offsets":[8,8]},)"
                             R"("f":{"dtype":"F64","shape":[],"data_offsets":[8,16]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]},)"
                             R"("g":{"dtype":"I32","shape":[1],"data_offsets":[24,28]},)"
                             "\"w\\\"\\n\\u0001\xc3\xa9/\":"
                             R"({"dtype":"I32","shape":[1],"data_offsets":[28,32]},)"
                             R"("h":{"dtype":"BF16","shape":[1],"data_offsets":[32,34]},)"
                             R"("c":{"dtype":"F16","shape":[1],"data_offsets":[34,36]},)"
                             R"("d":{"dtype":"BOOL","shape":[2],"data_offsets":[36,38]}})"
                             "      ";
  REQUIRE(header.size() == 544);
  const std::string data = std::string("\x07\x00\x00\x00\x00\x00\x00\x00", 8)    // a: 7
                           + std::string("\x00\x00\x00\x00\x00\x00\x08\x40", 8)  // f: 3.0
                           + std::string("\x00\x00\x80\x3f\x00\x00\x00\x40", 8)  // b: 1, 2
                           + std::string("\xfe\xff\xff\xff", 4)                  // g: -2
                           + std::string("\x01\x00\x00\x00", 4)                  // w...: 1
                           + std::string("\x80\xbf", 2)                          // h: bf16 -1
                           + std::string("\x00\x3e", 2)                          // c: f16 1.5
                           + std::string("\x01\x00", 2);                         // d: true, false
  const std::string expected = std::string("\x20\x02\x00\x00\x00\x00\x00\x00", 8) + header + data;

  const std::string path = dir.file("small.safetensors");
  nn::save_safetensors(sd, path, {{"format", "pt"}});
  const std::string got = read_bytes(path);
  CHECK(got.size() == expected.size());
  CHECK(got == expected);

  // And kiln reads it back as written.
  nn::StateDict back = nn::load_safetensors(path);
  CHECK(back.keys() == std::vector<std::string>{"a", "e", "f", "b", "g", "w\"\n\x01\xc3\xa9/", "h", "c", "d"});
  CHECK(back["h"].to_vector<float>() == std::vector<float>{-1.0f});
  CHECK(back["c"].to_vector<float>() == std::vector<float>{1.5f});
  CHECK(back["w\"\n\x01\xc3\xa9/"].to_vector<std::int32_t>() == std::vector<std::int32_t>{1});
}

TEST_CASE("safetensors: a hand-built Python-style file loads (metadata, keys out of data order, whitespace, escapes)") {
  TempDir dir;
  // Keys in an order other than the data's, __metadata__ in the middle, fields in another
  // order, spaces, tabs and newlines, \u escapes (a surrogate pair, é) and an escaped '/'.
  const std::string header =
      "{\n"
      "  \"z.bias\"  : {\"data_offsets\":[8, 16], \"shape\": [2], \"dtype\": \"F32\"},\r\n"
      "\t\"__metadata__\" : { \"format\" : \"pt\", \"note\": \"caf\\u00e9 \\ud83d\\ude00 \\/ \\\"q\\\"\\n\" },\n"
      "  \"a\\u002eweight\": { \"shape\" : [ 2 ], \"dtype\":\"I32\", \"data_offsets\" : [ 0 , 8 ] } ,\n"
      "  \"\\u00e9mpty\" : {\"dtype\":\"BF16\",\"shape\":[0, 5],\"data_offsets\":[16,16]},\n"
      "  \"flag\":{\"dtype\":\"BOOL\",\"shape\":[],\"data_offsets\":[16,17]}\n"
      "}   \t\n";
  std::string data;
  const std::int32_t ints[2] = {3, -4};
  const float floats[2] = {0.5f, -1.0f};
  data.append(reinterpret_cast<const char*>(ints), 8);
  data.append(reinterpret_cast<const char*>(floats), 8);
  data += '\x01';
  const std::string path = dir.file("python.safetensors");
  write_bytes(path, st_file(header, data));

  nn::StateDict sd = nn::load_safetensors(path, device());
  CHECK(sd.keys() == std::vector<std::string>{"a.weight", "z.bias", "\xc3\xa9mpty", "flag"});
  CHECK(sd["a.weight"].dtype() == i32);
  CHECK(sd["a.weight"].to_vector<std::int32_t>() == std::vector<std::int32_t>{3, -4});
  CHECK(sd["z.bias"].to_vector<float>() == std::vector<float>{0.5f, -1.0f});
  CHECK(sd["\xc3\xa9mpty"].dtype() == bf16);
  CHECK(sd["\xc3\xa9mpty"].shape() == Shape{0, 5});
  CHECK(sd["flag"].dim() == 0);
  CHECK(sd["flag"].item<bool>());
  for (const auto& [name, t] : sd) CHECK(t.device() == device());
  CHECK(nn::safetensors_metadata(path) ==
        std::map<std::string, std::string>{{"format", "pt"}, {"note", "caf\xc3\xa9 \xf0\x9f\x98\x80 / \"q\"\n"}});

  // A bool byte other than 0 or 1 reads as true (not as an invalid bool).
  data.back() = '\x07';
  write_bytes(path, st_file(header, data));
  CHECK(nn::load_safetensors(path)["flag"].to_vector<std::int32_t>() == std::vector<std::int32_t>{1});
}

TEST_CASE("safetensors: dtypes kiln lacks are a CheckpointError naming the dtype and the tensor") {
  TempDir dir;
  const std::map<std::string, std::size_t> sizes = {{"I8", 1},  {"U8", 1},  {"I16", 2},     {"U16", 2},
                                                    {"U32", 4}, {"U64", 8}, {"F8_E4M3", 1}, {"C64", 8}};
  for (const auto& [dtype, bytes] : sizes) {
    INFO("dtype " << dtype);
    // A valid file: a good F32 tensor first, then the one kiln cannot hold.
    const std::string header = R"({"ok":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"q.weight":{"dtype":")" +
                               dtype + R"(","shape":[3],"data_offsets":[4,)" + std::to_string(4 + 3 * bytes) + "]}}";
    check_rejected_bytes(dir, dtype, with_zeros(header, 4 + 3 * bytes),
                         {"tensor 'q.weight'", "dtype " + dtype, "kiln has no dtype"}, true);
  }
}

TEST_CASE("safetensors: every malformed file is a CheckpointError naming the file, the tensor and the fault") {
  TempDir dir;
  const std::string good = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  // The good file loads, so each case below fails for its own reason only.
  write_bytes(dir.file("good.safetensors"), with_zeros(good, 8));
  CHECK(nn::load_safetensors(dir.file("good.safetensors")).size() == 1);

  SUBCASE("the file and the header length") {
    check_rejected_bytes(dir, "shorter than 8 bytes", std::string("\x02\x00\x00", 3), {"3 bytes, too short"});
    check_rejected_bytes(dir, "empty file", "", {"0 bytes, too short"});
    check_rejected_bytes(dir, "N past the end", u64_le(1000) + good, {"header length is 1000 bytes", "holds only"});
    check_rejected_bytes(dir, "N > 100 MB", u64_le(100'000'001) + good, {"100000001", "more than the 100000000"});
    check_rejected_bytes(dir, "N = 2^64 - 1", u64_le(UINT64_MAX) + good, {"18446744073709551615"});
    check_rejected_bytes(dir, "N = 0", u64_le(0) + good, {"not valid JSON", "end of text"});
    check_rejected(dir.file("missing.safetensors"), {"cannot open"});
    fs::create_directory(dir.path / "sub.safetensors");
    check_rejected(dir.file("sub.safetensors"), {"is a directory"});
  }

  SUBCASE("not valid JSON") {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {R"({"a":)", "end of text"},
        {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},})", "expected a string key, found '}'"},
        {R"({'a':1})", "expected a string key"},
        {R"({"a" 1})", "expected ':'"},
        {R"({"a":{"dtype":"F32","shape":[2] "data_offsets":[0,8]}})", "or ',' after an object member"},
        {R"({"a":{"dtype":"F32","shape":[2,],"data_offsets":[0,8]}})", "expected a value"},
        {R"({"a\x":1})", "invalid escape"},
        {R"({"a\u12G4":1})", "invalid hex digit"},
        {R"({"\ud800":1})", "lone high surrogate"},
        {R"({"\ud800\u0041":1})", "lone high surrogate"},
        {R"({"\udc00":1})", "lone low surrogate"},
        {"{\"a\nb\":1}", "unescaped control character"},
        {R"({"a":{"dtype":"F32","shape":[02],"data_offsets":[0,8]}})", "leading zero"},
        {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} x)", "after the JSON value"},
        {R"({"a":NaN})", "unexpected 'N'"},
        {R"({"a":tru})", "expected a value"},
        {R"({"a":-})", "invalid number"},
        {R"({"a":1.})", "after '.'"},
        {R"({"a":1e})", "exponent"},
        {R"({"a":"unterminated})", "unterminated string"},
        {"{\"a\":" + std::string(100, '[') + std::string(100, ']') + "}", "nesting deeper than 64"},
        {"\xef\xbb\xbf{}", "expected a value"},  // a byte-order mark is not JSON
    };
    for (const auto& [header, needle] : cases)
      check_rejected_bytes(dir, header, with_zeros(header, 8), {"not valid JSON", needle});
    // Bytes that are not UTF-8: a stray byte, an overlong '/', an encoded surrogate, a
    // truncated sequence.
    const std::vector<std::pair<std::string, std::string>> not_utf8 = {
        {"{\"a\":1}\xff", "at byte 7 of the header"},
        {"{\"\xc0\xaf\":1}", "at byte 2 of the header"},
        {"{\"\xed\xa0\x80\":1}", "at byte 2 of the header"},
        {"{\"\xe2\x82\":1}", "at byte 2 of the header"},
    };
    for (const auto& [header, needle] : not_utf8)
      check_rejected_bytes(dir, header, with_zeros(header, 8), {"the header is not valid UTF-8", needle});
  }

  SUBCASE("not an object, or entries of the wrong shape") {
    check_rejected_bytes(dir, "array", with_zeros("[]", 0), {"the header is an array, not a JSON object"});
    check_rejected_bytes(dir, "string", with_zeros(R"("x")", 0), {"the header is a string"});
    check_rejected_bytes(dir, "null", with_zeros("null", 0), {"the header is null"});
    check_rejected_bytes(dir, "entry not an object", with_zeros(R"({"w":[1]})", 0),
                         {"tensor 'w'", "its header entry is an array"});
    check_rejected_bytes(dir, "missing shape", with_zeros(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", 8),
                         {"tensor 'w'", "missing field 'shape'"});
    check_rejected_bytes(dir, "missing dtype", with_zeros(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", 8),
                         {"tensor 'w'", "missing field 'dtype'"});
    check_rejected_bytes(dir, "missing data_offsets", with_zeros(R"({"w":{"dtype":"F32","shape":[2]}})", 8),
                         {"tensor 'w'", "missing field 'data_offsets'"});
    check_rejected_bytes(dir, "extra field",
                         with_zeros(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"stride":[1]}})", 8),
                         {"tensor 'w'", "unknown field 'stride'"});
    check_rejected_bytes(dir, "unknown dtype",
                         with_zeros(R"({"w":{"dtype":"F128","shape":[2],"data_offsets":[0,8]}})", 8),
                         {"tensor 'w'", "unknown dtype 'F128'"});
    check_rejected_bytes(dir, "lower-case dtype",
                         with_zeros(R"({"w":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}})", 8),
                         {"tensor 'w'", "unknown dtype 'f32'"});
    check_rejected_bytes(dir, "dtype not a string",
                         with_zeros(R"({"w":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", 8),
                         {"tensor 'w'", "dtype is a number"});
    check_rejected_bytes(dir, "metadata not an object", with_zeros(R"({"__metadata__":"pt"})", 0),
                         {"__metadata__ is a string"});
    check_rejected_bytes(dir, "metadata null", with_zeros(R"({"__metadata__":null})", 0), {"__metadata__ is null"});
    check_rejected_bytes(dir, "metadata value not a string", with_zeros(R"({"__metadata__":{"epoch":3}})", 0),
                         {"__metadata__ entry 'epoch' is a number"});
  }

  SUBCASE("shapes") {
    auto entry = [](const std::string& shape, const std::string& offsets) {
      return R"({"w":{"dtype":"F32","shape":)" + shape + R"(,"data_offsets":)" + offsets + "}}";
    };
    check_rejected_bytes(dir, "negative size", with_zeros(entry("[2,-1]", "[0,8]"), 8),
                         {"tensor 'w'", "shape has the entry -1, not a non-negative integer"});
    check_rejected_bytes(dir, "fractional size", with_zeros(entry("[2.0]", "[0,8]"), 8), {"tensor 'w'", "entry 2.0"});
    check_rejected_bytes(dir, "exponent size", with_zeros(entry("[2e0]", "[0,8]"), 8), {"tensor 'w'", "entry 2e0"});
    check_rejected_bytes(dir, "string size", with_zeros(entry(R"(["2"])", "[0,8]"), 8),
                         {"tensor 'w'", "entry a string"});
    check_rejected_bytes(dir, "shape not an array", with_zeros(entry("2", "[0,8]"), 8),
                         {"tensor 'w'", "shape is a number"});
    check_rejected_bytes(dir, "size past int64", with_zeros(entry("[9223372036854775808]", "[0,8]"), 8),
                         {"tensor 'w'", "larger than int64"});
    check_rejected_bytes(dir, "size past u64", with_zeros(entry("[18446744073709551616]", "[0,8]"), 8),
                         {"tensor 'w'", "entry 18446744073709551616"});
    check_rejected_bytes(dir, "sub-byte dtype, odd count",
                         with_zeros(R"({"w":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}})", 1),
                         {"tensor 'w'", "shape [3] of F4 (4 bits each) is not a whole number of bytes"});
    check_rejected_bytes(dir, "numel overflows", with_zeros(entry("[4294967296,4294967296,16]", "[0,8]"), 8),
                         {"tensor 'w'", "too many elements"});
  }

  SUBCASE("data_offsets") {
    auto entry = [](const std::string& offsets) {
      return R"({"w":{"dtype":"F32","shape":[2],"data_offsets":)" + offsets + "}}";
    };
    check_rejected_bytes(dir, "one offset", with_zeros(entry("[8]"), 8), {"tensor 'w'", "an array of 1 elements"});
    check_rejected_bytes(dir, "three offsets", with_zeros(entry("[0,8,8]"), 8),
                         {"tensor 'w'", "an array of 3 elements"});
    check_rejected_bytes(dir, "not an array", with_zeros(entry(R"({"begin":0})"), 8), {"tensor 'w'", "is an object"});
    check_rejected_bytes(dir, "negative offset", with_zeros(entry("[-1,7]"), 8), {"tensor 'w'", "entry -1"});
    check_rejected_bytes(dir, "string offset", with_zeros(entry(R"(["0",8])"), 8), {"tensor 'w'", "entry a string"});
    check_rejected_bytes(dir, "reversed", with_zeros(entry("[8,0]"), 8), {"tensor 'w'", "end before they begin"});
    check_rejected_bytes(dir, "size mismatch", with_zeros(entry("[0,4]"), 4),
                         {"tensor 'w'", "span 4 bytes", "shape [2] of F32 takes 8 bytes"});
    check_rejected_bytes(dir, "past the buffer", with_zeros(entry("[8,16]"), 8),
                         {"tensor 'w'", "[8, 16] run past the end of the data buffer (8 bytes"});
    check_rejected_bytes(dir, "truncated data", with_zeros(entry("[0,8]"), 5), {"tensor 'w'", "run past the end"});
    check_rejected_bytes(dir, "overlap",
                         with_zeros(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                    12),
                         {"tensor 'b' (data_offsets [4, 12]) overlaps tensor 'a' (data_offsets [0, 8])"});
    check_rejected_bytes(dir, "same span twice",
                         with_zeros(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                    R"("b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})",
                                    8),
                         {"tensor 'b'", "overlaps tensor 'a'"});
    check_rejected_bytes(dir, "empty tensor inside another",
                         with_zeros(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                    R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                                    8),
                         {"tensor 'e'", "overlaps tensor 'a'"});
    check_rejected_bytes(dir, "hole",
                         with_zeros(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                                    20),
                         {"bytes [8, 12) of the data buffer belong to no tensor", "before tensor 'b'"});
    check_rejected_bytes(dir, "hole at the start", with_zeros(entry("[4,12]"), 12),
                         {"bytes [0, 4) of the data buffer belong to no tensor", "before tensor 'w'"});
    check_rejected_bytes(dir, "bytes after the last tensor", with_zeros(entry("[0,8]"), 12),
                         {"the last 4 of the 12 bytes of the data buffer belong to no tensor", "after tensor 'w'"});
    check_rejected_bytes(dir, "data but no tensors", with_zeros("{}", 4), {"the header lists none"});
    check_rejected_bytes(dir, "offset past u64", with_zeros(entry("[0,99999999999999999999]"), 8),
                         {"tensor 'w'", "entry 99999999999999999999"});
  }

  SUBCASE("duplicate keys") {
    check_rejected_bytes(dir, "duplicate tensor",
                         with_zeros(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                    R"("w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                                    16),
                         {"duplicate key 'w'"});
    check_rejected_bytes(dir, "duplicate field",
                         with_zeros(R"({"w":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
                         {"duplicate key 'dtype'"});
    check_rejected_bytes(dir, "duplicate metadata key", with_zeros(R"({"__metadata__":{"k":"1","k":"2"}})", 0),
                         {"duplicate key 'k'"});
    check_rejected_bytes(dir, "duplicate by escape", with_zeros(R"({"__metadata__":{"k":"1","\u006b":"2"}})", 0),
                         {"duplicate key 'k'"});
    check_rejected_bytes(dir, "two __metadata__", with_zeros(R"({"__metadata__":{},"__metadata__":{}})", 0),
                         {"duplicate key '__metadata__'"});
  }

  SUBCASE("a bad file leaves a module as it was") {
    write_bytes(dir.file("bad.safetensors"), with_zeros(R"({"weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                                        R"("bias":{"dtype":"I16","shape":[2],"data_offsets":[8,12]}})",
                                                        12));
    MockModule m;
    m.weight = from_vector<float>({1, 2}, {2}, device());
    m.bias = from_vector<float>({3}, {1}, device());
    const ir::NodePtr weight = m.weight.node(), bias = m.bias.node();
    CHECK_THROWS_AS(nn::load(m, dir.file("bad.safetensors")), CheckpointError);
    CHECK(m.loads == 0);
    CHECK(m.weight.node() == weight);
    CHECK(m.bias.node() == bias);
    CHECK(m.weight.to_vector<float>() == std::vector<float>{1, 2});
  }
}

TEST_CASE("safetensors: a failed save leaves the existing file as it was and no temporary file") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  nn::StateDict good;
  good.insert("w", from_vector<float>({1, 2, 3}, {3}, device()));
  nn::save_safetensors(good, path, {{"step", "1"}});
  const std::string before = read_bytes(path);

  SUBCASE("a tensor that fails to evaluate, after others were written") {
    // "a" (I64) is written first; "z" (F32) is an embedding whose computed index is out of
    // range, which only its evaluation finds: the error surfaces mid-file.
    Tensor weight = from_vector<float>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {5, 2}, device());
    Tensor index = from_vector<std::int64_t>({1, 2, 7}, {3}, device()) + std::int64_t(0);
    nn::StateDict bad;
    bad.insert("a", from_vector<std::int64_t>({1, 2, 3, 4}, {4}, device()));
    bad.insert("z", embedding(weight, index));
    CHECK_THROWS_AS(nn::save_safetensors(bad, path), IndexError);
  }
  SUBCASE("an undefined tensor") {
    nn::StateDict bad;
    bad.insert("a", from_vector<float>({1}, {1}, device()));
    bad.insert("missing", Tensor());
    CHECK_THROWS_WITH_AS(nn::save_safetensors(bad, path), doctest::Contains("tensor 'missing' is undefined"),
                         CheckpointError);
  }
  SUBCASE("a tensor named __metadata__") {
    nn::StateDict bad;
    bad.insert("__metadata__", from_vector<float>({1}, {1}, device()));
    CHECK_THROWS_WITH_AS(nn::save_safetensors(bad, path), doctest::Contains("'__metadata__'"), CheckpointError);
  }
  SUBCASE("a name that is not UTF-8") {
    nn::StateDict bad;
    bad.insert("w\xff", from_vector<float>({1}, {1}, device()));
    CHECK_THROWS_WITH_AS(nn::save_safetensors(bad, path), doctest::Contains("not valid UTF-8"), CheckpointError);
  }
  SUBCASE("metadata that is not UTF-8") {
    CHECK_THROWS_WITH_AS(nn::save_safetensors(good, path, {{"k", "\xc3"}}), doctest::Contains("metadata entry 'k'"),
                         CheckpointError);
  }
  SUBCASE("the target is a directory: the rename fails") {
    const std::string sub = dir.file("sub");
    fs::create_directory(sub);
    CHECK_THROWS_WITH_AS(nn::save_safetensors(good, sub), doctest::Contains("renaming"), CheckpointError);
    CHECK(fs::is_directory(sub));
    CHECK(fs::is_empty(sub));
    fs::remove(sub);
  }
  SUBCASE("a directory that does not exist") {
    CHECK_THROWS_WITH_AS(nn::save_safetensors(good, dir.file("nowhere/model.safetensors")),
                         doctest::Contains("cannot create the temporary file"), CheckpointError);
  }
  CHECK(read_bytes(path) == before);
  CHECK(dir.listing() == std::vector<std::string>{"model.safetensors"});
  CHECK(nn::load_safetensors(path)["w"].to_vector<float>() == std::vector<float>{1, 2, 3});
  CHECK(nn::safetensors_metadata(path) == std::map<std::string, std::string>{{"step", "1"}});
}

TEST_CASE("safetensors: save and load through a module-like type and through StateDict") {
  TempDir dir;
  const std::string path = dir.file("module.safetensors");
  MockModule trained;
  trained.weight = from_vector<float>({1, -2, 3, -4, 5, -6}, {2, 3}, device());
  trained.bias = from_vector<float>({0.5f, 0.25f}, {2}, device());
  nn::save(trained, path);
  CHECK(nn::load(path).keys() == std::vector<std::string>{"bias", "weight"});

  MockModule fresh;
  fresh.weight = zeros({2, 3}, f32, device());
  fresh.bias = zeros({2}, f32, device());
  nn::load(fresh, path);
  CHECK(fresh.loads == 1);
  CHECK(fresh.last_strict);
  CHECK(fresh.weight.device() == device());  // the device of the module's first state tensor
  CHECK(fresh.bias.device() == device());
  CHECK(fresh.weight.shape() == Shape{2, 3});
  CHECK(fresh.weight.to_vector<float>() == trained.weight.to_vector<float>());
  CHECK(fresh.bias.to_vector<float>() == trained.bias.to_vector<float>());

  // strict = false reaches load_state_dict; a strict module rejecting the keys propagates.
  nn::StateDict with_extra;
  with_extra.insert("weight", trained.weight);
  with_extra.insert("bias", trained.bias);
  with_extra.insert("extra", trained.bias);
  nn::save(with_extra, path);
  CHECK_THROWS_AS(nn::load(fresh, path), ValueError);
  nn::load(fresh, path, /*strict=*/false);
  CHECK_FALSE(fresh.last_strict);

  // StateDict overloads: save(StateDict, path) and load(path) (CPU).
  nn::StateDict sd = nn::load(path);
  CHECK(sd.size() == 3);
  for (const auto& [name, t] : sd) CHECK(t.device() == Device::cpu());
  const std::string copy = dir.file("copy.safetensors");
  nn::save(sd, copy);
  CHECK(read_bytes(copy) == read_bytes(path));
}

}  // namespace kiln_test_nn_safetensors
