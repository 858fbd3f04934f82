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
  // The padding row reads as what the table holds there (zero unless changed), without gradient.
  return functional::embedding(indices, weight, padding_idx);
}


KILN_ENTRY Tensor LayerNorm::forward(const Tensor& x) {
  return functional::layer_norm(x, normalized_shape, weight, bias, eps);
}

KILN_ENTRY Tensor RMSNorm::forward(const Tensor& x) { return functional::rms_norm(x, normalized_shape, weight, eps); }

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
KILN_ENTRY Linear::Linear(std::int64_t in_features, std::int64_t out_features, bool bias, DType dtype, Device device)
    : in_features(in_features), out_features(out_features) {
  if (in_features < 0 || out_features < 0)
    throw ValueError("Linear: features must be non-negative, got in " + std::to_string(in_features) + ", out " +
                     std::to_string(out_features));
  const double bound = in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(in_features)) : 0.0;
  weight = init::uniform({out_features, in_features}, -bound, bound, dtype, device);
  register_parameter("weight", weight);
  if (bias) {
    this->bias = init::uniform({out_features}, -bound, bound, dtype, device);
    register_parameter("bias", this->bias);
  }
}

KILN_ENTRY Embedding::Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim,
                                std::optional<std::int64_t> padding_idx, DType dtype, Device device)
    : num_embeddings(num_embeddings), embedding_dim(embedding_dim) {
  if (padding_idx) {
    std::int64_t p = *padding_idx < 0 ? *padding_idx + num_embeddings : *padding_idx;
    if (p < 0 || p >= num_embeddings)
      throw IndexError("Embedding: padding_idx " + std::to_string(*padding_idx) + " is out of range for " +
                       std::to_string(num_embeddings) + " embeddings");
    this->padding_idx = p;
  }
  weight = init::normal({num_embeddings, embedding_dim}, 0.0, 1.0, dtype, device);
  if (this->padding_idx) {
    NoGradGuard off;
    weight.assign(where(
        reshape(arange(num_embeddings, DType::Int64, device), {num_embeddings, 1}) == *this->padding_idx, 0.0, weight));
  }
  register_parameter("weight", weight);
}

KILN_ENTRY LayerNorm::LayerNorm(Shape normalized_shape, double eps, bool elementwise_affine, bool bias, DType dtype,
                                Device device)
    : normalized_shape(detail::checked_normalized_shape("LayerNorm", std::move(normalized_shape))), eps(eps) {
  if (elementwise_affine) {
    weight = ones(this->normalized_shape, dtype, device);
    register_parameter("weight", weight);
    if (bias) {
      this->bias = zeros(this->normalized_shape, dtype, device);
      register_parameter("bias", this->bias);
    }
  }
}

KILN_ENTRY RMSNorm::RMSNorm(Shape normalized_shape, std::optional<double> eps, bool elementwise_affine, DType dtype,
                            Device device)
    : normalized_shape(detail::checked_normalized_shape("RMSNorm", std::move(normalized_shape))), eps(eps) {
  if (elementwise_affine) {
    weight = ones(this->normalized_shape, dtype, device);
    register_parameter("weight", weight);
  }
}

KILN_ENTRY MultiheadAttention::MultiheadAttention(std::int64_t embed_dim, std::int64_t num_heads, double dropout,
                                                  bool bias, bool batch_first, DType dtype, Device device)
    : embed_dim(embed_dim),
      num_heads(num_heads),
      dropout(dropout),
      batch_first(batch_first),
      out_proj(embed_dim, embed_dim, bias, dtype, device) {
  if (num_heads <= 0 || embed_dim % num_heads != 0)
    throw ValueError("MultiheadAttention: embed_dim " + std::to_string(embed_dim) + " must be divisible by num_heads " +
                     std::to_string(num_heads));
  in_proj_weight = empty({3 * embed_dim, embed_dim}, dtype, device);
  init::xavier_uniform_(in_proj_weight);
  register_parameter("in_proj_weight", in_proj_weight);
  if (bias) {
    in_proj_bias = zeros({3 * embed_dim}, dtype, device);
    register_parameter("in_proj_bias", in_proj_bias);
    init::zeros_(out_proj.bias);
  }
  register_module("out_proj", out_proj);
}

KILN_ENTRY std::pair<Tensor, Tensor> MultiheadAttention::forward(const Tensor& query, const Tensor& key,
                                                                 const Tensor& value, const Tensor& attn_mask_in,
                                                                 bool need_weights, bool is_causal,
                                                                 const Tensor& key_padding_mask,
                                                                 bool average_attn_weights) {
  if (query.dim() != 3 || key.dim() != 3 || value.dim() != 3 || query.shape()[2] != embed_dim ||
      key.shape()[2] != embed_dim || value.shape()[2] != embed_dim)
    throw ShapeError("MultiheadAttention: query " + query.describe() + ", key " + key.describe() + ", value " +
                     value.describe() + " must be 3-d with embedding size " + std::to_string(embed_dim));
  // Work batch first: [N, L, E].
  Tensor q = batch_first ? query : transpose(query, 0, 1);
  Tensor k = batch_first ? key : transpose(key, 0, 1);
  Tensor v = batch_first ? value : transpose(value, 0, 1);
  const std::int64_t N = q.shape()[0], L = q.shape()[1], S = k.shape()[1], H = num_heads, D = embed_dim / H;
  // torch's checks: one batch size, and a value for every key.
  if (k.shape()[0] != N || v.shape()[0] != N || v.shape()[1] != S)
    throw ShapeError("MultiheadAttention: query " + query.describe() + ", key " + key.describe() + " and value " +
                     value.describe() + " must share the batch size, and key and value the sequence length (" +
                     (batch_first ? "batch_first: [N, L, E]" : "[L, N, E]; batch_first is false") + ")");
  // The masks as one [L, S] or [N, H | 1, L | 1, S] mask (bool when both are bool or one is
  // absent, else float, added), checked before anything is computed.
  auto check_mask = [&](const Tensor& m, const char* what, bool shape_ok) {
    if (m.dtype() != DType::Bool && !is_floating(m.dtype()))
      throw DTypeError(std::string("MultiheadAttention: ") + what + " must be bool or floating, got " + m.describe());
    if (!shape_ok)
      throw ShapeError(std::string("MultiheadAttention: ") + what + " " + m.describe() + " does not fit query " +
                       query.describe() + " and key " + key.describe() + " (" + std::to_string(H) + " heads)");
  };
  Tensor attn_mask = attn_mask_in;
  if (attn_mask.defined()) {
    const Shape& ms = attn_mask.shape();
    check_mask(attn_mask, "attn_mask",
               (ms == Shape{L, S}) || (ms.size() == 3 && ms[0] == N * H && ms[1] == L && ms[2] == S));
    if (ms.size() == 3) attn_mask = reshape(attn_mask, {N, H, L, S});
  }
  if (key_padding_mask.defined()) {
    check_mask(key_padding_mask, "key_padding_mask", key_padding_mask.shape() == Shape{N, S});
    const Tensor padding = reshape(key_padding_mask, {N, 1, 1, S});
    if (!attn_mask.defined()) {
      attn_mask = padding;
    } else if (attn_mask.dtype() == DType::Bool && padding.dtype() == DType::Bool) {
      attn_mask = logical_or(attn_mask, padding);
    } else {
      auto additive = [&](const Tensor& m) {
        return m.dtype() == DType::Bool ? Tensor(masked_fill(zeros(m.shape(), query.dtype(), m.device()), m, -INFINITY))
                                        : m.to(query.dtype());
      };
      attn_mask = additive(attn_mask) + additive(padding);
    }
  }
  auto project = [&](const Tensor& x, std::int64_t part) {
    Tensor w = slice(in_proj_weight, 0, part * embed_dim, (part + 1) * embed_dim);
    Tensor b = in_proj_bias.defined() ? slice(in_proj_bias, 0, part * embed_dim, (part + 1) * embed_dim) : Tensor();
    const std::int64_t T = x.shape()[1];
    return transpose(reshape(functional::linear(x, w, b), {N, T, H, D}), 1, 2);  // [N, H, T, D]
  };
  Tensor qh = project(q, 0), kh = project(k, 1), vh = project(v, 2);
  Tensor attended, averaged;  // [N, H, L, D]; the weights when need_weights
  if (!need_weights && !(is_causal && attn_mask.defined())) {
    // torch's fast path: with no weights to return, one fused attention, dropout inside it
    // (drawing its key as dropout() does, so the same seed drops the same weights). A row
    // whose keys are all masked gives 0 here, NaN written out.
    const Tensor take = attn_mask.defined() && attn_mask.dtype() == DType::Bool ? logical_not(attn_mask) : attn_mask;
    attended = functional::scaled_dot_product_attention(qh, kh, vh, take, is_training() ? dropout : 0.0, is_causal);
  } else {
    Tensor scores = matmul(qh, transpose(kh, -2, -1)) * (1.0 / std::sqrt(static_cast<double>(D)));
    if (is_causal) scores = scores + functional::causal_mask(L, S, scores.dtype(), scores.device());
    if (attn_mask.defined())
      scores = attn_mask.dtype() == DType::Bool ? masked_fill(scores, attn_mask, -INFINITY)
                                                : Tensor(scores + attn_mask.to(scores.dtype()));
    Tensor weights = softmax(scores, -1);
    attended = matmul(functional::dropout(weights, dropout, is_training()), vh);
    if (need_weights) averaged = average_attn_weights ? mean(weights, {1}) : weights;
  }
  Tensor out = out_proj.forward(reshape(transpose(attended, 1, 2), {N, L, embed_dim}));
  if (!batch_first) out = transpose(out, 0, 1);
  return {out, averaged};
}

KILN_ENTRY CausalSelfAttention::CausalSelfAttention(std::int64_t n_embd, std::int64_t n_head, double dropout, bool bias,
                                                    DType dtype, Device device)
    : n_embd(n_embd),
      n_head(n_head),
      dropout(dropout),
      c_attn(n_embd, 3 * n_embd, bias, dtype, device),
      c_proj(n_embd, n_embd, bias, dtype, device) {
  if (n_head <= 0 || n_embd % n_head != 0)
    throw ValueError("CausalSelfAttention: n_embd " + std::to_string(n_embd) + " must be divisible by n_head " +
                     std::to_string(n_head));
  register_module("c_attn", c_attn);
  register_module("c_proj", c_proj);
}

}  // namespace kiln::nn
