#pragma once
// The definitions of the parameter initialisers (nn::init) (nn/layers.hpp). Header-only mode includes them from that
// header (KILN_ENTRY is `inline`); compiled mode compiles them once into kiln::kiln_compiled
// (src/kiln_compiled.cpp), so users' translation units parse the declarations only.
#include "kiln/nn/layers.hpp"

namespace kiln::nn {
namespace init {

KILN_ENTRY Tensor uniform(const Shape& shape, double low, double high, DType dtype, Device device) {
  NoGradGuard off;
  return (rand(shape, dtype, device) * (high - low) + low).eval();
}

KILN_ENTRY Tensor normal(const Shape& shape, double mean, double std, DType dtype, Device device) {
  NoGradGuard off;
  return (randn(shape, dtype, device) * std + mean).eval();
}

KILN_ENTRY Tensor& uniform_(Tensor& t, double low, double high) {
  NoGradGuard off;
  t.assign(uniform(t.shape(), low, high, t.dtype(), t.device()));
  return t;
}

KILN_ENTRY Tensor& normal_(Tensor& t, double mean, double std) {
  NoGradGuard off;
  t.assign(normal(t.shape(), mean, std, t.dtype(), t.device()));
  return t;
}

KILN_ENTRY Tensor& constant_(Tensor& t, double value) {
  NoGradGuard off;
  t.assign(value);
  return t;
}

KILN_ENTRY Tensor& zeros_(Tensor& t) { return constant_(t, 0.0); }

KILN_ENTRY Tensor& ones_(Tensor& t) { return constant_(t, 1.0); }

KILN_ENTRY std::pair<std::int64_t, std::int64_t> fans(const Tensor& t) {
  if (t.dim() < 2)
    throw ShapeError("init: fan in and fan out need a tensor of at least 2 dimensions, got " + t.describe());
  std::int64_t field = 1;
  for (std::int64_t d = 2; d < t.dim(); ++d) field *= t.shape()[static_cast<std::size_t>(d)];
  return {t.shape()[1] * field, t.shape()[0] * field};
}

KILN_ENTRY Tensor& xavier_uniform_(Tensor& t, double gain) {
  auto [in, out] = fans(t);
  const double b = gain * std::sqrt(6.0 / static_cast<double>(in + out));
  return uniform_(t, -b, b);
}

KILN_ENTRY Tensor& kaiming_uniform_(Tensor& t, double a) {
  auto [in, out] = fans(t);
  const double gain = std::sqrt(2.0 / (1.0 + a * a));
  const double b = gain * std::sqrt(3.0 / static_cast<double>(in));
  return uniform_(t, -b, b);
}

}  // namespace init
}  // namespace kiln::nn

namespace kiln::nn {

KILN_ENTRY Tensor Embedding::forward(const Tensor& indices) {
  if (!padding_idx) return embedding(weight, indices);
  // The padding row's gradient is zero: its rows of the result are cut from the tape.
  Tensor rows = embedding(weight, indices);
  Tensor pad = unsqueeze(indices == *padding_idx, -1);
  return where(pad, 0.0, rows);
}

KILN_ENTRY Tensor LayerNorm::forward(const Tensor& x) {
  if (x.dim() == 0 || x.shape().back() != normalized_shape)
    throw ShapeError("LayerNorm: input " + x.describe() + " must end in the normalized size " +
                     std::to_string(normalized_shape));
  return layer_norm(x, weight, bias, eps);
}

KILN_ENTRY Tensor RMSNorm::forward(const Tensor& x) {
  if (x.dim() == 0 || x.shape().back() != normalized_shape)
    throw ShapeError("RMSNorm: input " + x.describe() + " must end in the normalized size " +
                     std::to_string(normalized_shape));
  return rms_norm(x, weight, eps);
}

KILN_ENTRY const std::shared_ptr<Module>& ModuleList::at(std::size_t i) const {
  if (i >= items_.size())
    throw IndexError("ModuleList: index " + std::to_string(i) + " is out of range for " +
                     std::to_string(items_.size()) + " modules");
  return items_[i];
}

KILN_ENTRY Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (const std::shared_ptr<Module>& m : items_) y = m->forward(y);
  return y;
}

KILN_ENTRY Tensor CausalSelfAttention::forward(const Tensor& x) {
  if (x.dim() != 3 || x.shape()[2] != n_embd)
    throw ShapeError("CausalSelfAttention: input " + x.describe() + " must be [B, T, " + std::to_string(n_embd) + "]");
  const std::int64_t B = x.shape()[0], T = x.shape()[1], H = n_head, D = n_embd / n_head;
  Tensor qkv = c_attn.forward(x);  // [B, T, 3C]
  auto head = [&](std::int64_t part) {
    return transpose(reshape(slice(qkv, 2, part * n_embd, (part + 1) * n_embd), {B, T, H, D}), 1, 2);
  };
  Tensor y =
      functional::scaled_dot_product_attention(head(0), head(1), head(2), {}, is_training() ? dropout : 0.0, true);
  y = reshape(transpose(y, 1, 2), {B, T, n_embd});
  return functional::dropout(c_proj.forward(y), dropout, is_training());
}
}  // namespace kiln::nn
