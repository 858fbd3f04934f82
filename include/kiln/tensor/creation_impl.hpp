#pragma once
// The definitions of the tensor creation functions (tensor/creation.hpp). Header-only mode includes them from that
// header (KILN_ENTRY is `inline`); compiled mode compiles them once into kiln::kiln_compiled
// (src/kiln_compiled.cpp), so users' translation units parse the declarations only.
#include "kiln/tensor/creation.hpp"

namespace kiln {
namespace detail {

KILN_ENTRY Tensor filled(const Shape& shape, double value, DType dtype, Device device, const char* op) {
  check_creation_shape(shape, op, dtype);
  return Tensor(ir::constant(value, dtype, shape, device));
}

}  // namespace detail
}  // namespace kiln

namespace kiln {

KILN_ENTRY Tensor arange(std::int64_t n, DType dtype, Device device) {
  if (n < 0) throw ShapeError("arange: negative length " + std::to_string(n));
  return Tensor(ir::iota(Shape{n}, 0, dtype, device));
}

}  // namespace kiln

namespace kiln {
namespace detail {

KILN_ENTRY Tensor arange_range(double start, double end, double step, bool integral_bounds, DType dtype,
                               Device device) {
  auto bounds = [&] {
    std::ostringstream os;
    os << "(start " << start << ", end " << end << ", step " << step << ")";
    return os.str();
  };
  if (!std::isfinite(start) || !std::isfinite(end))
    throw ValueError("arange: unsupported range " + bounds() + ": bounds must be finite");
  if (step == 0 || !std::isfinite(step)) throw ValueError("arange: step must be finite and nonzero " + bounds());
  if ((end - start) * step < 0)
    throw ValueError("arange: the bounds are inconsistent with the step's sign " + bounds());
  const double count = std::ceil((end - start) / step);
  if (count > 9.0e18) throw ValueError("arange: too many elements " + bounds());
  const auto n = static_cast<std::int64_t>(count);
  check_creation_shape(Shape{n}, "arange", dtype);
  const DType compute = integral_bounds && !is_floating(dtype) ? DType::Int64 : DType::Float64;
  const bool exact_int = compute == DType::Int64;
  auto number = [&](double v) {
    return exact_int ? ir::constant_int(static_cast<std::int64_t>(v), compute, Shape{n}, device)
                     : ir::constant(v, compute, Shape{n}, device);
  };
  ir::NodePtr values = ir::iota(Shape{n}, 0, compute, device);
  if (step != 1) values = ir::binary(ir::Op::Mul, values, number(step));
  if (start != 0) values = ir::binary(ir::Op::Add, values, number(start));
  return Tensor(compute == dtype ? values : ir::cast(values, dtype));
}

KILN_ENTRY ir::NodePtr random_node(const Shape& shape, std::uint64_t seed, int distribution, DType dtype,
                                   Device device) {
  if (device.is_cpu() && !deferring_eval())
    return ir::random(shape, number_leaf(seed, DType::Int64, Shape{}, device), distribution, dtype, device);
  return ir::random(shape, seed, distribution, dtype, device);
}

KILN_ENTRY void check_random(const Shape& shape, const char* op, DType dtype) {
  check_creation_shape(shape, op, dtype);
  if (!is_floating(dtype))
    throw DTypeError(std::string(op) + ": dtype must be floating point, got " + dtype_name(dtype));
}

}  // namespace detail
}  // namespace kiln

namespace kiln {

KILN_ENTRY Tensor rand(const Shape& shape, std::uint64_t seed, DType dtype, Device device) {
  detail::check_random(shape, "rand", dtype);
  return Tensor(detail::random_node(shape, seed, 0, dtype, device));
}

KILN_ENTRY Tensor randn(const Shape& shape, std::uint64_t seed, DType dtype, Device device) {
  detail::check_random(shape, "randn", dtype);
  return Tensor(detail::random_node(shape, seed, 1, dtype, device));
}

}  // namespace kiln

namespace kiln {
namespace detail {

KILN_ENTRY GlobalGenerator& global_generator() {
  static GlobalGenerator g;
  return g;
}

KILN_ENTRY std::uint64_t next_generator_key(const char* op) {
  if (active_trace)
    throw ValueError(std::string(op) +
                     " without a seed inside kiln::compile: the traced graph would replay the same numbers on every "
                     "call; pass the seed in (rand(shape, seed, ...)) from outside the compiled function");
  GlobalGenerator& g = global_generator();
  std::uint64_t z = g.seed.load() + 0x9e3779b97f4a7c15ull * (g.drawn.fetch_add(1) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace detail
}  // namespace kiln

namespace kiln {

KILN_ENTRY void manual_seed(std::uint64_t seed) {
  detail::global_generator().seed = seed;
  detail::global_generator().drawn = 0;
}

KILN_ENTRY Tensor rand(const Shape& shape, DType dtype, Device device) {
  detail::check_random(shape, "rand", dtype);
  return Tensor(detail::random_node(shape, detail::next_generator_key("rand"), 0, dtype, device));
}

KILN_ENTRY Tensor randn(const Shape& shape, DType dtype, Device device) {
  detail::check_random(shape, "randn", dtype);
  return Tensor(detail::random_node(shape, detail::next_generator_key("randn"), 1, dtype, device));
}

KILN_ENTRY Tensor empty(const Shape& shape, DType dtype, Device device) {
  detail::check_creation_shape(shape, "empty", dtype);
  ir::Node like;
  like.shape = shape;
  like.dtype = dtype;
  like.device = device;
  StoragePtr st = detail::allocate_value(like, "empty");
  return Tensor(ir::input(ir::BufferView{st, 0, contiguous_strides(shape)}, shape, dtype, device));
}

}  // namespace kiln
