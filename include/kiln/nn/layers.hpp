#pragma once
// The layers of kiln::nn, with PyTorch's parameter names, shapes and default initialisation
// (drawn from the global generator: manual_seed makes them reproducible).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/nn/functional.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/tensor/methods.hpp"

namespace kiln::nn {

namespace init {
/// Uniform numbers in [low, high) of `shape` from the global generator.
KILN_ENTRY Tensor uniform(const Shape& shape, double low, double high, DType dtype = f32,
                          Device device = Device::cpu());
/// Normal numbers N(mean, std^2) of `shape` from the global generator.
KILN_ENTRY Tensor normal(const Shape& shape, double mean = 0.0, double std = 1.0, DType dtype = f32,
                         Device device = Device::cpu());
/// Writes U(low, high) into `t` in place (torch.nn.init.uniform_).
KILN_ENTRY Tensor& uniform_(Tensor& t, double low = 0.0, double high = 1.0);
/// Writes N(mean, std^2) into `t` in place (torch.nn.init.normal_).
KILN_ENTRY Tensor& normal_(Tensor& t, double mean = 0.0, double std = 1.0);
KILN_ENTRY Tensor& constant_(Tensor& t, double value);
KILN_ENTRY Tensor& zeros_(Tensor& t);
KILN_ENTRY Tensor& ones_(Tensor& t);
/// fan_in and fan_out of a weight (torch.nn.init._calculate_fan_in_and_fan_out).
KILN_ENTRY std::pair<std::int64_t, std::int64_t> fans(const Tensor& t);
/// U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)) (torch.nn.init.xavier_uniform_).
KILN_ENTRY Tensor& xavier_uniform_(Tensor& t, double gain = 1.0);
/// torch.nn.init.kaiming_uniform_ with leaky_relu gain sqrt(2 / (1 + a^2)) over fan_in.
KILN_ENTRY Tensor& kaiming_uniform_(Tensor& t, double a = 0.0);
}  // namespace init

/// y = x W^T + b (torch.nn.Linear): weight [out_features, in_features], bias [out_features];
/// both U(-1/sqrt(in), 1/sqrt(in)) as PyTorch's reset_parameters.
class Linear : public Module {
 public:
  KILN_ENTRY Linear(std::int64_t in_features, std::int64_t out_features, bool bias = true, DType dtype = f32,
                    Device device = Device::cpu());
  Tensor forward(const Tensor& x) override { return functional::linear(x, weight, bias); }
  std::string name() const override { return "Linear"; }

  std::int64_t in_features, out_features;
  Tensor weight, bias;
};

/// A lookup table (torch.nn.Embedding): weight [num_embeddings, embedding_dim] ~ N(0, 1); the
/// row of `padding_idx` starts at zero and gets no gradient (a value written there, by
/// load_state_dict say, is what its lookups return, as in torch).
class Embedding : public Module {
 public:
  KILN_ENTRY Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim,
                       std::optional<std::int64_t> padding_idx = std::nullopt, DType dtype = f32,
                       Device device = Device::cpu());
  KILN_ENTRY Tensor forward(const Tensor& indices) override;
  std::string name() const override { return "Embedding"; }

  std::int64_t num_embeddings, embedding_dim;
  std::optional<std::int64_t> padding_idx;
  Tensor weight;
};

/// Layer normalisation over the trailing dims `normalized_shape` (torch.nn.LayerNorm; an int
/// is one dim): weight ones, bias zeros, both of shape `normalized_shape`.
class LayerNorm : public Module {
 public:
  KILN_ENTRY LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true, bool bias = true,
                       DType dtype = f32, Device device = Device::cpu());
  LayerNorm(std::int64_t normalized_shape, double eps = 1e-5, bool elementwise_affine = true, bool bias = true,
            DType dtype = f32, Device device = Device::cpu())
      : LayerNorm(Shape{normalized_shape}, eps, elementwise_affine, bias, dtype, device) {}
  KILN_ENTRY Tensor forward(const Tensor& x) override;
  std::string name() const override { return "LayerNorm"; }

  Shape normalized_shape;
  double eps;
  Tensor weight, bias;
};

/// RMS normalisation over the trailing dims `normalized_shape` (torch.nn.RMSNorm; an int is one
/// dim): weight ones of shape `normalized_shape`; eps defaults to the machine epsilon of the
/// dtype the norm computes in (float32's for float16 and bfloat16 inputs, as torch's kernels).
class RMSNorm : public Module {
 public:
  KILN_ENTRY explicit RMSNorm(Shape normalized_shape, std::optional<double> eps = std::nullopt,
                              bool elementwise_affine = true, DType dtype = f32, Device device = Device::cpu());
  explicit RMSNorm(std::int64_t normalized_shape, std::optional<double> eps = std::nullopt,
                   bool elementwise_affine = true, DType dtype = f32, Device device = Device::cpu())
      : RMSNorm(Shape{normalized_shape}, eps, elementwise_affine, dtype, device) {}
  KILN_ENTRY Tensor forward(const Tensor& x) override;
  std::string name() const override { return "RMSNorm"; }

  Shape normalized_shape;
  std::optional<double> eps;
  Tensor weight;
};

/// Dropout with probability p while training (torch.nn.Dropout); the identity in eval().
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5) : p(p) {
    if (!(p >= 0.0 && p <= 1.0))
      throw ValueError("Dropout: probability has to be between 0 and 1, but got " + std::to_string(p));
  }
  Tensor forward(const Tensor& x) override { return functional::dropout(x, p, is_training()); }
  std::string name() const override { return "Dropout"; }
  double p;
};

/// GELU, exact ("none") or with the tanh approximation ("tanh").
class GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none") : approximate(std::move(approximate)) {
    if (this->approximate != "none" && this->approximate != "tanh")
      throw ValueError("GELU: approximate must be 'none' or 'tanh', got '" + this->approximate + "'");
  }
  Tensor forward(const Tensor& x) override { return gelu(x, approximate == "tanh"); }
  std::string name() const override { return "GELU"; }
  std::string approximate;
};

/// relu(x) (torch.nn.ReLU).
class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return relu(x); }
  std::string name() const override { return "ReLU"; }
};

/// silu(x) (torch.nn.SiLU).
class SiLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return silu(x); }
  std::string name() const override { return "SiLU"; }
};

/// tanh(x) (torch.nn.Tanh).
class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override { return tanh(x); }
  std::string name() const override { return "Tanh"; }
};

/// The input itself (torch.nn.Identity).
class Identity : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x; }
  std::string name() const override { return "Identity"; }
};

/// sigmoid(x) (torch.nn.Sigmoid).
class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& x) override { return sigmoid(x); }
  std::string name() const override { return "Sigmoid"; }
};

/// leaky_relu(x, negative_slope) (torch.nn.LeakyReLU).
class LeakyReLU : public Module {
 public:
  explicit LeakyReLU(double negative_slope = 0.01) : negative_slope(negative_slope) {}
  Tensor forward(const Tensor& x) override { return leaky_relu(x, negative_slope); }
  std::string name() const override { return "LeakyReLU"; }
  double negative_slope;
};

/// elu(x, alpha) (torch.nn.ELU).
class ELU : public Module {
 public:
  explicit ELU(double alpha = 1.0) : alpha(alpha) {}
  Tensor forward(const Tensor& x) override { return elu(x, alpha); }
  std::string name() const override { return "ELU"; }
  double alpha;
};

/// selu(x) (torch.nn.SELU).
class SELU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return selu(x); }
  std::string name() const override { return "SELU"; }
};

/// celu(x, alpha) (torch.nn.CELU; alpha 0 is a ValueError when it runs, as torch's).
class CELU : public Module {
 public:
  explicit CELU(double alpha = 1.0) : alpha(alpha) {}
  Tensor forward(const Tensor& x) override { return celu(x, alpha); }
  std::string name() const override { return "CELU"; }
  double alpha;
};

/// softplus(x, beta, threshold) (torch.nn.Softplus).
class Softplus : public Module {
 public:
  explicit Softplus(double beta = 1.0, double threshold = 20.0) : beta(beta), threshold(threshold) {}
  Tensor forward(const Tensor& x) override { return softplus(x, beta, threshold); }
  std::string name() const override { return "Softplus"; }
  double beta, threshold;
};

/// mish(x) (torch.nn.Mish).
class Mish : public Module {
 public:
  Tensor forward(const Tensor& x) override { return mish(x); }
  std::string name() const override { return "Mish"; }
};

/// hardtanh(x, min_val, max_val) (torch.nn.Hardtanh): max_val must be greater than min_val
/// (ValueError; torch asserts it).
class Hardtanh : public Module {
 public:
  explicit Hardtanh(double min_val = -1.0, double max_val = 1.0) : min_val(min_val), max_val(max_val) {
    if (!(max_val > min_val))
      throw ValueError("Hardtanh: max_val (" + std::to_string(max_val) + ") must be greater than min_val (" +
                       std::to_string(min_val) + ")");
  }
  Tensor forward(const Tensor& x) override { return hardtanh(x, min_val, max_val); }
  std::string name() const override { return "Hardtanh"; }
  double min_val, max_val;
};

/// relu6(x) (torch.nn.ReLU6).
class ReLU6 : public Module {
 public:
  Tensor forward(const Tensor& x) override { return relu6(x); }
  std::string name() const override { return "ReLU6"; }
};

/// hardsigmoid(x) (torch.nn.Hardsigmoid).
class Hardsigmoid : public Module {
 public:
  Tensor forward(const Tensor& x) override { return hardsigmoid(x); }
  std::string name() const override { return "Hardsigmoid"; }
};

/// hardswish(x) (torch.nn.Hardswish).
class Hardswish : public Module {
 public:
  Tensor forward(const Tensor& x) override { return hardswish(x); }
  std::string name() const override { return "Hardswish"; }
};

/// logsigmoid(x) (torch.nn.LogSigmoid).
class LogSigmoid : public Module {
 public:
  Tensor forward(const Tensor& x) override { return logsigmoid(x); }
  std::string name() const override { return "LogSigmoid"; }
};

/// softsign(x) (torch.nn.Softsign).
class Softsign : public Module {
 public:
  Tensor forward(const Tensor& x) override { return softsign(x); }
  std::string name() const override { return "Softsign"; }
};

/// tanhshrink(x) (torch.nn.Tanhshrink).
class Tanhshrink : public Module {
 public:
  Tensor forward(const Tensor& x) override { return tanhshrink(x); }
  std::string name() const override { return "Tanhshrink"; }
};

/// softshrink(x, lambd) (torch.nn.Softshrink).
class Softshrink : public Module {
 public:
  explicit Softshrink(double lambd = 0.5) : lambd(lambd) {}
  Tensor forward(const Tensor& x) override { return softshrink(x, lambd); }
  std::string name() const override { return "Softshrink"; }
  double lambd;
};

/// hardshrink(x, lambd) (torch.nn.Hardshrink).
class Hardshrink : public Module {
 public:
  explicit Hardshrink(double lambd = 0.5) : lambd(lambd) {}
  Tensor forward(const Tensor& x) override { return hardshrink(x, lambd); }
  std::string name() const override { return "Hardshrink"; }
  double lambd;
};

/// flatten(x, start_dim, end_dim) (torch.nn.Flatten: by default every dim but the batch dim).
class Flatten : public Module {
 public:
  explicit Flatten(std::int64_t start_dim = 1, std::int64_t end_dim = -1) : start_dim(start_dim), end_dim(end_dim) {}
  Tensor forward(const Tensor& x) override {
    // A 0-dim input counts as one dim for the dims' range, as torch.flatten's check.
    if (x.dim() == 0) {
      normalize_axis(start_dim, 1, "Flatten", x.shape());
      normalize_axis(end_dim, 1, "Flatten", x.shape());
    }
    return flatten(x, start_dim, end_dim);
  }
  std::string name() const override { return "Flatten"; }
  std::int64_t start_dim, end_dim;
};

namespace detail {
/// torch's _get_softmax_dim for a Softmax/LogSoftmax built without a dim: 0 for 0-, 1- and
/// 3-dim inputs, else 1 (torch warns that this choice is deprecated).
inline std::int64_t softmax_dim(std::optional<std::int64_t> dim, const Tensor& x) {
  if (dim) return *dim;
  return x.dim() == 0 || x.dim() == 1 || x.dim() == 3 ? 0 : 1;
}
}  // namespace detail

/// softmax(x, dim) (torch.nn.Softmax); without a dim, torch's legacy choice (detail::softmax_dim).
class Softmax : public Module {
 public:
  explicit Softmax(std::optional<std::int64_t> dim = std::nullopt) : dim(dim) {}
  Tensor forward(const Tensor& x) override { return softmax(x, detail::softmax_dim(dim, x)); }
  std::string name() const override { return "Softmax"; }
  std::optional<std::int64_t> dim;
};

/// log_softmax(x, dim) (torch.nn.LogSoftmax); without a dim, torch's legacy choice.
class LogSoftmax : public Module {
 public:
  explicit LogSoftmax(std::optional<std::int64_t> dim = std::nullopt) : dim(dim) {}
  Tensor forward(const Tensor& x) override { return log_softmax(x, detail::softmax_dim(dim, x)); }
  std::string name() const override { return "LogSoftmax"; }
  std::optional<std::int64_t> dim;
};

/// A list of modules registered under "0", "1", ... (torch.nn.ModuleList); it has no forward.
class ModuleList : public Module {
 public:
  ModuleList() = default;
  template <class... Ms>
  // Not for one ModuleList-like argument: that is a copy or a move (nest one with push_back).
  requires(sizeof...(Ms) > 0 && (std::is_base_of_v<Module, std::decay_t<Ms>> && ...) &&
           !(sizeof...(Ms) == 1 &&
             (std::is_base_of_v<ModuleList, std::decay_t<Ms>> && ...))) explicit ModuleList(Ms&&... ms) {
    (push_back(std::forward<Ms>(ms)), ...);
  }
  /// Appends a copy (or the moved module) owned by the list; returns it.
  template <class M>
  requires std::is_base_of_v<Module, std::decay_t<M>> std::decay_t<M>
  &push_back(M&& module) {
    auto owned = std::make_shared<std::decay_t<M>>(std::forward<M>(module));
    return *push_back(std::move(owned));
  }
  /// Appends a shared module; returns it.
  template <class M>
  requires std::is_base_of_v<Module, M> std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    register_module(std::to_string(items_.size()), module);
    items_.push_back(module);
    return module;
  }
  Module& operator[](std::size_t i) { return *at(i); }
  /// The i-th module as its own type (libtorch's ptr<T>).
  template <class M>
  M& get(std::size_t i) {
    M* m = dynamic_cast<M*>(at(i).get());
    if (!m) throw ValueError("ModuleList: module " + std::to_string(i) + " is a " + at(i)->name() + ", not that type");
    return *m;
  }
  std::size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  auto begin() { return items_.begin(); }
  auto end() { return items_.end(); }
  std::string name() const override { return "ModuleList"; }

 protected:
  const std::shared_ptr<Module>& at(std::size_t i) const;
  std::vector<std::shared_ptr<Module>> items_;
};

/// Modules applied one after another (torch.nn.Sequential): `Sequential(Linear(4, 8),
/// ReLU(), Linear(8, 2))`; children are named "0", "1", ...
class Sequential : public ModuleList {
 public:
  using ModuleList::ModuleList;
  KILN_ENTRY Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Sequential"; }
};

/// Multi-head attention (torch.nn.MultiheadAttention with kdim = vdim = embed_dim):
/// in_proj_weight [3E, E] (xavier uniform), in_proj_bias [3E] (zeros), out_proj a Linear(E, E)
/// whose bias starts at zero. Inputs are [L, N, E] (or [N, L, E] with batch_first).
class MultiheadAttention : public Module {
 public:
  KILN_ENTRY MultiheadAttention(std::int64_t embed_dim, std::int64_t num_heads, double dropout = 0.0, bool bias = true,
                                bool batch_first = false, DType dtype = f32, Device device = Device::cpu());

  /// The attention output and, when `need_weights`, the attention weights ([N, L, S] averaged
  /// over heads, or [N, H, L, S] without `average_attn_weights`; undefined otherwise).
  /// `attn_mask` [L, S] or [N * H, L, S] and `key_padding_mask` [N, S] (bool: true = masked out,
  /// as torch's MultiheadAttention; float: added; the two are added together, as torch merges
  /// them), `is_causal` masks the future. Without `need_weights` (and unless is_causal comes with
  /// a mask) it runs as one fused scaled_dot_product_attention, dropout included, as torch's
  /// fast path does. (The masks' order differs from libtorch's forward, whose fourth argument is
  /// key_padding_mask.)
  KILN_ENTRY std::pair<Tensor, Tensor> forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                               const Tensor& attn_mask = {}, bool need_weights = true,
                                               bool is_causal = false, const Tensor& key_padding_mask = {},
                                               bool average_attn_weights = true);
  /// Self-attention of x (query = key = value); the output only.
  Tensor forward(const Tensor& x) override { return forward(x, x, x, {}, false).first; }
  using Module::operator();
  /// forward(query, key, value, ...): `mha(q, k, v)` as torch's module call.
  std::pair<Tensor, Tensor> operator()(const Tensor& query, const Tensor& key, const Tensor& value,
                                       const Tensor& attn_mask = {}, bool need_weights = true, bool is_causal = false,
                                       const Tensor& key_padding_mask = {}, bool average_attn_weights = true) {
    return forward(query, key, value, attn_mask, need_weights, is_causal, key_padding_mask, average_attn_weights);
  }
  std::string name() const override { return "MultiheadAttention"; }

  std::int64_t embed_dim, num_heads;
  double dropout;
  bool batch_first;
  Tensor in_proj_weight, in_proj_bias;
  Linear out_proj;
};

/// GPT-2's causal self-attention block on [B, T, C]: c_attn Linear(C, 3C) into heads,
/// softmax(q k^T / sqrt(d)) v with the future masked, c_proj Linear(C, C), dropout on the
/// attention weights and the output.
class CausalSelfAttention : public Module {
 public:
  KILN_ENTRY CausalSelfAttention(std::int64_t n_embd, std::int64_t n_head, double dropout = 0.0, bool bias = true,
                                 DType dtype = f32, Device device = Device::cpu());
  KILN_ENTRY Tensor forward(const Tensor& x) override;
  std::string name() const override { return "CausalSelfAttention"; }

  std::int64_t n_embd, n_head;
  double dropout;
  Linear c_attn, c_proj;
};

}  // namespace kiln::nn

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/nn/layers_impl.hpp"
#endif
