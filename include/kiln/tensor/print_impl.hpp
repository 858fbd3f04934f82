#pragma once
// The definitions of printing (tensor/print.hpp). Header-only mode includes them from that
// header (KILN_ENTRY is `inline`); compiled mode compiles them once into kiln::kiln_compiled
// (src/kiln_compiled.cpp), so users' translation units parse the declarations only.
#include "kiln/tensor/print.hpp"

namespace kiln {
namespace detail {

KILN_ENTRY std::vector<std::int64_t> printed_indices(std::int64_t size, bool summarise) {
  std::vector<std::int64_t> idx;
  if (!summarise || size <= 2 * kEdgeItems) {
    for (std::int64_t i = 0; i < size; ++i) idx.push_back(i);
  } else {
    for (std::int64_t i = 0; i < kEdgeItems; ++i) idx.push_back(i);
    idx.push_back(-1);  // the elision mark
    for (std::int64_t i = size - kEdgeItems; i < size; ++i) idx.push_back(i);
  }
  return idx;
}

KILN_ENTRY FloatStyle float_style(const std::vector<double>& v) {
  FloatStyle s;
  double lo = INFINITY, hi = 0;
  for (double x : v) {
    if (!std::isfinite(x)) continue;
    if (x != std::floor(x)) s.integral = false;
    double a = std::fabs(x);
    if (a != 0) lo = std::min(lo, a);
    hi = std::max(hi, a);
  }
  s.scientific = hi >= 1e8 || (lo < 1e-4 && !s.integral) || (std::isfinite(lo) && hi / lo > 1000 && !s.integral);
  return s;
}

KILN_ENTRY std::string format_float(double x, const FloatStyle& s) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  if (s.scientific)
    std::snprintf(buf, sizeof buf, "%.4e", x);
  else if (s.integral)
    std::snprintf(buf, sizeof buf, "%.0f.", x);
  else
    std::snprintf(buf, sizeof buf, "%.4f", x);
  return buf;
}

KILN_ENTRY std::string format_values(const Tensor& t, std::size_t indent) {
  const Shape& shape = t.shape();
  const bool summarise = t.numel() > kPrintThreshold;
  std::vector<std::string> text(static_cast<std::size_t>(t.numel()));
  if (t.numel() > 0) {
    if (is_floating(t.dtype())) {
      std::vector<double> v = t.to_vector<double>();
      FloatStyle style = float_style(v);
      for (std::size_t i = 0; i < v.size(); ++i) text[i] = format_float(v[i], style);
    } else if (t.dtype() == DType::Bool) {
      std::vector<bool> v = t.to_vector<bool>();
      for (std::size_t i = 0; i < v.size(); ++i) text[i] = v[i] ? "True" : "False";
    } else {
      std::vector<std::int64_t> v = t.to_vector<std::int64_t>();
      for (std::size_t i = 0; i < v.size(); ++i) text[i] = std::to_string(v[i]);
    }
  }
  std::size_t width = 0;
  for (auto& s : text) width = std::max(width, s.size());
  if (shape.empty()) return text.empty() ? "" : text[0];

  const Strides strides = contiguous_strides(shape);
  std::string out;
  // Dimension d of the element block starting at flat index `base`.
  auto emit = [&](auto&& self, std::size_t d, std::int64_t base) -> void {
    out += '[';
    std::vector<std::int64_t> idx = printed_indices(shape[d], summarise);
    const bool last = d + 1 == shape.size();
    for (std::size_t k = 0; k < idx.size(); ++k) {
      if (k > 0) {
        out += ',';
        if (last)
          out += ' ';
        else
          out += std::string(shape.size() - d - 1, '\n') + std::string(indent + d + 1, ' ');
      }
      if (idx[k] < 0) {
        out += "...";
        continue;
      }
      const std::int64_t at = base + idx[k] * strides[d];
      if (last) {
        const std::string& s = text[static_cast<std::size_t>(at)];
        out += std::string(width - s.size(), ' ') + s;
      } else {
        self(self, d + 1, at);
      }
    }
    out += ']';
  };
  emit(emit, 0, 0);
  return out;
}

}  // namespace detail
}  // namespace kiln

namespace kiln {

KILN_ENTRY std::string Tensor::str() const {
  if (!node_) return "Tensor(undefined)";
  eval();  // printing is a read: the tensor itself is evaluated (then converted for the text)
  const std::string head = "tensor(";
  return head + detail::format_values(*this, head.size()) + ", dtype=" + dtype_name(dtype()) +
         ", shape=" + shape().str() + ", device=" + device().str() + ")";
}

}  // namespace kiln
