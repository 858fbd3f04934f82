// Errors: mismatched shapes, bad axes, wrong dtypes and mixed devices throw the typed error
// (ShapeError, DTypeError, DeviceError) at the line that builds the expression, before
// anything runs, with a message naming the op, the shapes and the dtypes; the library keeps
// working afterwards.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "../support/reference.hpp"

namespace kiln_test_tensor_errors {

using namespace kiln;
namespace kt = kiln::testing;

namespace {

/// Inputs that are already evaluated, so that any graph run after the snapshot is the error's.
struct Inputs {
  Tensor f23 = kt::make_tensor({1, 2, 3, 4, 5, 6}, {2, 3}, DType::Float32);
  Tensor h4 = kt::make_tensor({1, 2, 3, 4}, {4}, DType::Float16);
  Tensor i23 = kt::make_tensor({1, 2, 3, 4, 5, 6}, {2, 3}, DType::Int32);
  Tensor b23 = kt::make_tensor({1, 0, 1, 0, 1, 0}, {2, 3}, DType::Bool);
  Tensor i64v = kt::make_int_tensor({0, 1}, {2});
};

/// Snapshot of the counters; `unchanged()` is true when nothing was evaluated or launched since.
struct NothingRan {
  Stats before = stats();
  bool unchanged() const {
    Stats now = stats();
    return now.graphs == before.graphs && now.launches == before.launches && now.compiles == before.compiles;
  }
};

/// The library still computes correctly.
void check_still_works() {
  Tensor a = kt::make_tensor({1, 2, 3}, {3}, DType::Float32);
  KILN_CHECK_CLOSE(sum(a * 2.0f + 1.0f), std::vector<double>{15});
}

}  // namespace

TEST_CASE("mismatched shapes: ShapeError naming the op, both shapes and the dtypes") {
  Inputs in;
  NothingRan guard;
  KILN_CHECK_THROWS_MENTIONING(ShapeError, (void)(in.f23 + in.h4), "add", "[2, 3]", "[4]", "float32", "float16");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, (void)(in.i23 * in.h4), "mul", "[2, 3]", "[4]", "int32", "float16");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, (void)(in.f23 < in.h4), "lt", "[2, 3]", "[4]", "float32", "float16");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, (void)(maximum(in.h4, in.i23)), "maximum", "[4]", "[2, 3]", "float16",
                               "int32");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, (void)(pow(in.f23, in.h4)), "pow", "[2, 3]", "[4]");
  // Deep inside a typed expression: the failing op is the one named.
  KILN_CHECK_THROWS_MENTIONING(ShapeError, (void)(exp(in.f23 * 2.0f) - in.h4 * 3.0f), "sub", "[2, 3]", "[4]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, (void)(where(in.b23, in.f23, in.h4)), "where", "[2, 3]", "[4]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, (void)(where(in.i64v > 0, in.f23, 0.0f)), "where", "[2]", "[2, 3]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, (void)(clamp(in.f23, in.h4, 1.0f)), "clamp", "[2, 3]", "[4]", "float32",
                               "float16");
  CHECK(guard.unchanged());
  check_still_works();
}

TEST_CASE("bad axes: ShapeError naming the op, the axis, the shape and the dtype") {
  Inputs in;
  NothingRan guard;
  KILN_CHECK_THROWS_MENTIONING(ShapeError, sum(in.f23, 2), "sum", "axis 2", "[2, 3]", "float32");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, sum(in.f23, -3), "sum", "-3", "[2, 3]", "float32");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, max(in.i23, {0, 5}), "max", "5", "[2, 3]", "int32");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, mean(in.f23, {0, -2}), "mean", "[2, 3]", "float32");  // same axis twice
  KILN_CHECK_THROWS_MENTIONING(ShapeError, argmax(in.f23, 2), "argmax", "[2, 3]", "float32");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, argmin(in.f23, {0, 1}), "argmin", "[2, 3]", "float32");  // one axis only
  KILN_CHECK_THROWS_MENTIONING(ShapeError, logsumexp(in.h4, 1), "logsumexp", "[4]", "float16");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, var(in.f23, 7), "var", "[2, 3]", "float32");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, softmax(in.f23, 2), "softmax", "[2, 3]", "float32");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, log_softmax(in.f23, -3), "log_softmax", "[2, 3]", "float32");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, transpose(in.f23, 0, 2), "transpose", "[2, 3]", "float32");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, permute(in.f23, {0, 0}), "permute", "[2, 3]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, permute(in.f23, {1, 0, 2}), "permute", "[2, 3]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, unsqueeze(in.f23, 3), "unsqueeze", "[2, 3]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, squeeze(in.f23, 2), "squeeze", "[2, 3]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, slice(in.f23, 2, 0, 1), "slice", "[2, 3]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, concat({in.f23, in.f23}, 2), "concat", "[2, 3]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, in.f23.size(2), "size", "[2, 3]");
  CHECK(guard.unchanged());
  check_still_works();
}

TEST_CASE("wrong dtypes: DTypeError naming the op, the dtypes and the shapes") {
  Inputs in;
  NothingRan guard;
  KILN_CHECK_THROWS_MENTIONING(DTypeError, mean(in.i23), "mean", "int32", "[2, 3]");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, var(in.i23, 0), "var", "int32", "[2, 3]");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, layer_norm(in.i23), "layer_norm", "int32", "[2, 3]");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, rms_norm(in.b23), "rms_norm", "bool", "[2, 3]");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, (void)(in.b23 - in.b23), "sub", "bool", "[2, 3]");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, (void)(in.f23 - in.b23), "sub", "bool", "[2, 3]");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, (void)(in.b23 - 1), "sub", "bool", "[2, 3]");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, (void)(1.5f - in.b23), "sub", "bool", "[2, 3]");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, (void)(-in.b23), "neg", "bool", "[2, 3]");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, (void)(pow(in.b23, in.b23)), "pow", "bool", "[2, 3]");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, (void)(where(in.i23, in.f23, in.f23)), "where", "int32", "[2, 3]");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, argmax(in.b23), "argmax", "bool", "[2, 3]");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, cross_entropy(in.f23, kt::make_tensor({0, 1}, {2}, DType::Float16)),
                               "cross_entropy", "float16");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, cross_entropy(in.i23, in.i64v), "cross_entropy", "int32", "[2, 3]");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, layer_norm(in.f23, kt::make_tensor({1, 1, 1}, {3}, DType::Int32)),
                               "layer_norm", "int32", "[3]");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, rand({3}, 1, i64, kt::device()), "rand", "int64");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, randn({3}, 1, bool_, kt::device()), "randn", "bool");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, in.f23.data_ptr<double>(), "data_ptr", "float64", "float32", "[2, 3]");
  CHECK(guard.unchanged());
  check_still_works();
}

TEST_CASE("other shape errors name the op and the shapes") {
  Inputs in;
  NothingRan guard;
  KILN_CHECK_THROWS_MENTIONING(ShapeError, reshape(in.f23, {4, 2}), "reshape", "[4, 2]", "[2, 3]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, reshape(in.f23, {-1, -1}), "reshape", "[-1, -1]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, reshape(in.f23, {-1, 4}), "reshape", "[-1, 4]", "[2, 3]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, broadcast_to(in.f23, {3, 3}), "broadcast_to", "[2, 3]", "[3, 3]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, broadcast_to(in.f23, {3}), "broadcast_to", "[2, 3]", "[3]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, slice(in.f23, 1, 0, 3, 0), "slice", "step");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, slice(in.f23, 1, 0, 3, -1), "slice", "step");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, concat({in.f23, in.i23, in.h4}, 0), "concat", "[2, 3]", "[4]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, concat({}, 0), "concat");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, layer_norm(in.f23, in.h4), "layer_norm", "weight", "[2, 3]", "[4]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, rms_norm(in.f23, in.h4), "rms_norm", "weight", "[2, 3]", "[4]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, cross_entropy(in.f23, kt::make_int_tensor({0, 1, 2}, {3})), "cross_entropy",
                               "[2, 3]", "[3]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, cross_entropy(in.h4, in.i64v), "cross_entropy", "[4]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, from_vector<float>({1, 2, 3}, {2, 2}, kt::device()), "from_vector",
                               "[2, 2]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, zeros({2, -1}, f32, kt::device()), "[2, -1]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, arange(-3), "arange");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, in.f23.item<float>(), "item", "[2, 3]");
  CHECK(guard.unchanged());
  // assign checks its shapes before writing; the destination is already evaluated, so nothing runs.
  Tensor dst = kt::make_tensor({0, 0, 0, 0, 0, 0}, {2, 3}, DType::Float32);
  NothingRan guard2;
  KILN_CHECK_THROWS_MENTIONING(ShapeError, dst.assign(in.h4), "assign", "[4]", "[2, 3]");
  CHECK(guard2.unchanged());
  KILN_CHECK_CLOSE(dst, std::vector<double>(6, 0.0));
  check_still_works();
}

TEST_CASE("mixed devices: DeviceError naming the op and both devices") {
  // A lazy constant on another device needs no memory there, so this runs on any machine.
  const Device here = kt::device();
  const Device other = here.is_cpu() ? Device::cuda(0) : Device::cpu();
  Inputs in;
  Tensor far = zeros({2, 3}, f32, other);
  Tensor far_w = ones({3}, f32, other);
  CHECK(far.device() == other);
  NothingRan guard;
  KILN_CHECK_THROWS_MENTIONING(DeviceError, (void)(in.f23 + far), "add", here.str(), other.str());
  KILN_CHECK_THROWS_MENTIONING(DeviceError, (void)(far * in.f23), "mul", here.str(), other.str());
  KILN_CHECK_THROWS_MENTIONING(DeviceError, (void)(where(in.b23, in.f23, far)), "where", here.str(), other.str());
  KILN_CHECK_THROWS_MENTIONING(DeviceError, concat({in.f23, far}, 0), "concat", here.str(), other.str());
  KILN_CHECK_THROWS_MENTIONING(DeviceError, layer_norm(in.f23, far_w), "layer_norm", here.str(), other.str());
  KILN_CHECK_THROWS_MENTIONING(DeviceError, in.f23.assign(far), "assign", here.str(), other.str());
  CHECK(guard.unchanged());
  check_still_works();
}

TEST_CASE("undefined tensors and errors inside a chain leave earlier results usable") {
  Tensor u;
  CHECK_THROWS_AS(u + 1.0f, Error);
  CHECK_THROWS_AS(exp(u), Error);
  CHECK_THROWS_AS(u.item<float>(), Error);
  // An expression that failed to build does not poison the inputs or later work.
  Tensor x = kt::make_tensor({1, 2, 3, 4}, {2, 2}, DType::Float32);
  Tensor y = x * 2.0f;  // lazy
  CHECK_THROWS_AS(y + kt::make_tensor({1, 2, 3}, {3}, DType::Float32), ShapeError);
  CHECK_THROWS_AS(sum(y, 4), ShapeError);
  CHECK_FALSE(y.is_evaluated());
  KILN_CHECK_CLOSE(y + 1.0f, kt::Ref{{3, 5, 7, 9}, {2, 2}});
  for (int i = 0; i < 3; ++i) CHECK_THROWS_AS(mean(kt::make_tensor({1, 2}, {2}, DType::Int64)), DTypeError);
  check_still_works();
}

TEST_CASE(
    "shape ops name the input's dtype; sizes past int64 and impossible memory are typed errors before anything runs") {
  Inputs in;
  {
    NothingRan guard;
    KILN_CHECK_THROWS_MENTIONING(ShapeError, reshape(in.i23, {4, 2}), "reshape", "int32[2, 3]", "[4, 2]");
    KILN_CHECK_THROWS_MENTIONING(ShapeError, permute(in.b23, {0, 0}), "permute", "bool[2, 3]");
    KILN_CHECK_THROWS_MENTIONING(ShapeError, concat({in.f23, in.h4}, 0), "concat", "float32[2, 3]", "float16[4]");
    KILN_CHECK_THROWS_MENTIONING(ShapeError, unsqueeze(in.h4, 3), "unsqueeze", "float16[4]", "[-2, 1]");
    KILN_CHECK_THROWS_MENTIONING(ShapeError, broadcast_to(in.i23, {3, 3}), "broadcast_to", "int32[2, 3]", "[3, 3]");
    KILN_CHECK_THROWS_MENTIONING(ShapeError, slice(in.f23, 1, 0, 3, 0), "slice", "step", "float32[2, 3]");
    // Axes of a 0-dim tensor are checked too ([-1, 0] only).
    KILN_CHECK_THROWS_MENTIONING(ShapeError, transpose(full({}, 1.0), 5, 7), "transpose", "axis 5", "float32[]");
    KILN_CHECK_THROWS_MENTIONING(ShapeError, softmax(full({}, 1.0), 3), "softmax", "axis 3");
    KILN_CHECK_THROWS_MENTIONING(ShapeError, log_softmax(full({}, 1.0), -2), "log_softmax", "axis -2");
    CHECK(transpose(full({}, 1.0), 0, -1).dim() == 0);
    // Element or byte counts that overflow int64.
    const std::int64_t big = std::int64_t(1) << 40, huge = std::int64_t(1) << 32;
    KILN_CHECK_THROWS_MENTIONING(ShapeError, zeros({big, big}), "zeros", "[1099511627776, 1099511627776]");
    KILN_CHECK_THROWS_MENTIONING(ShapeError, zeros({std::int64_t(1) << 62}), "zeros", "bytes");
    KILN_CHECK_THROWS_MENTIONING(ShapeError, randn({std::int64_t(1) << 31, std::int64_t(1) << 31, 4}, 1), "randn");
    KILN_CHECK_THROWS_MENTIONING(ShapeError, broadcast_to(ones({1}), {huge, huge}), "broadcast_to",
                                 "[4294967296, 4294967296]");
    KILN_CHECK_THROWS_MENTIONING(ShapeError, (void)(ones({big, 1}) + ones({1, big})), "add", "too many elements");
    float one = 0;
    KILN_CHECK_THROWS_MENTIONING(ShapeError, from_blob(&one, {huge, huge}), "from_blob", "[4294967296, 4294967296]");
    KILN_CHECK_THROWS_MENTIONING(ValueError, from_blob(static_cast<float*>(nullptr), {3}), "from_blob", "null",
                                 "float32[3]");
    CHECK(from_blob(static_cast<float*>(nullptr), {0}).numel() == 0);  // an empty view needs no memory
    CHECK(guard.unchanged());
  }
  // A huge step is one element, not a negative size.
  CHECK(slice(in.f23, 1, 0, 3, INT64_MAX).shape() == Shape{2, 1});
  KILN_CHECK_CLOSE(slice(in.f23, 1, 1, 3, INT64_MAX), std::vector<double>{2, 5});
  // Memory that cannot be had: an OutOfMemoryError naming the shape and the bytes, nothing run.
  {
    NothingRan guard;
    Tensor t = zeros({std::int64_t(1) << 61}, DType::Bool);  // 2 EiB: past any address space
    KILN_CHECK_THROWS_MENTIONING(OutOfMemoryError, t.eval(), "eval", "bool[2305843009213693952]",
                                 "2305843009213693952 bytes");
    CHECK(guard.unchanged());
  }
  check_still_works();
}

TEST_CASE("pow, clamp, full and cross_entropy follow PyTorch's value rules") {
  // Integers to negative integer powers are not allowed (a number as the exponent).
  KILN_CHECK_THROWS_MENTIONING(DTypeError, (void)pow(arange(3), -1), "pow", "negative", "int64[3]");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, (void)pow(ones({2}, DType::Int32), -2), "pow", "int32[2]");
  KILN_CHECK_CLOSE(pow(arange(3), 2), std::vector<double>{0, 1, 4});
  KILN_CHECK_CLOSE(pow(arange(3).to(DType::Float32), -1), std::vector<double>{INFINITY, 1, 0.5});
  // A tensor exponent follows integer pow (1, -1 exact; other bases 0), as torch.pow does.
  KILN_CHECK_CLOSE(pow(kt::make_int_tensor({1, -1, 2}, {3}), kt::make_int_tensor({-1, -1, -1}, {3})),
                   std::vector<double>{1, -1, 0});
  // clamp's dtype is the result type of all three at once: bool, 0-dim f64 and f32 give f32.
  CHECK(clamp(ones({3}, DType::Bool), full({}, 0.5, DType::Float64), zeros({3})).dtype() == DType::Float32);
  KILN_CHECK_CLOSE(clamp(ones({3}, DType::Bool), full({}, 0.5, DType::Float64), zeros({3})),
                   std::vector<double>{0, 0, 0});
  CHECK(clamp(ones({3}, DType::Int32), full({}, 2, DType::Int64), 5).dtype() == DType::Int32);
  // A constant follows the cast rule: NaN and out-of-range values give the minimum.
  CHECK(full({3}, NAN, DType::Int32).to_vector<std::int32_t>() == std::vector<std::int32_t>(3, INT32_MIN));
  CHECK(full({2}, 1e300, DType::Int64).to_vector<std::int64_t>() == std::vector<std::int64_t>(2, INT64_MIN));
  CHECK(full({2}, -2.7, DType::Int64).to_vector<std::int64_t>() == std::vector<std::int64_t>(2, -2));
  CHECK(full({1}, NAN, DType::Bool).item<bool>());
  // A class target outside [0, C): IndexError naming the target and C (host targets); the
  // ignore index is not one.
  Tensor logits = kt::make_tensor({0.5, 1, 2, -1, 0, 3}, {2, 3}, DType::Float32);
  if (kt::on_cpu()) {
    KILN_CHECK_THROWS_MENTIONING(IndexError, cross_entropy(logits, kt::make_int_tensor({7, 1}, {2})), "cross_entropy",
                                 "target 7", "3 classes");
    KILN_CHECK_THROWS_MENTIONING(IndexError, cross_entropy(logits, kt::make_int_tensor({0, -1}, {2})), "cross_entropy",
                                 "target -1");
  } else {  // device targets are checked by the kernel that reads them, raised on reading back
    KILN_CHECK_THROWS_MENTIONING(IndexError, cross_entropy(logits, kt::make_int_tensor({7, 1}, {2})).item<float>(),
                                 "cross_entropy", "index 7", "size 3");
    KILN_CHECK_THROWS_MENTIONING(IndexError, cross_entropy(logits, kt::make_int_tensor({0, -1}, {2})).item<float>(),
                                 "cross_entropy", "index -1");
  }
  Tensor ok = cross_entropy(logits, kt::make_int_tensor({2, -100}, {2}));
  CHECK(std::isfinite(ok.item<float>()));
  // Lazy targets are not read by the front end: the kernel reading an out-of-range one reports it.
  Tensor lazy = kt::make_int_tensor({7, 1}, {2}) + 0;
  KILN_CHECK_THROWS_MENTIONING(IndexError, cross_entropy(logits, lazy).item<float>(), "cross_entropy", "index 7");
  CHECK(std::isfinite(cross_entropy(logits, kt::make_int_tensor({1, 1}, {2}) + 0).item<float>()));
}

}  // namespace kiln_test_tensor_errors
