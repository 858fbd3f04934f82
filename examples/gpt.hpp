#pragma once
// A GPT in kiln::nn (the GPT-2 layout, as nanoGPT writes it): token and position embeddings,
// N blocks of [LayerNorm, causal self-attention, LayerNorm, MLP with tanh-GELU] with
// residuals, a final LayerNorm and a head tied to the token embedding. Used by
// examples/train_gpt.cpp, the nn tests and the T1 benchmark.
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <kiln/kiln.hpp>

namespace gpt {

struct Config {
  std::int64_t vocab_size = 256;
  std::int64_t block_size = 64;  ///< longest sequence (rows of the position embedding)
  std::int64_t n_layer = 2;
  std::int64_t n_head = 4;
  std::int64_t n_embd = 64;
  double dropout = 0.0;
};

struct Mlp : kiln::nn::Module {
  kiln::nn::Linear c_fc, c_proj;
  double dropout;
  Mlp(const Config& c) : c_fc(c.n_embd, 4 * c.n_embd), c_proj(4 * c.n_embd, c.n_embd), dropout(c.dropout) {
    register_module("c_fc", c_fc);
    register_module("c_proj", c_proj);
  }
  kiln::Tensor forward(const kiln::Tensor& x) override {
    return kiln::nn::functional::dropout(c_proj(kiln::gelu(c_fc(x), true)), dropout, is_training());
  }
};

struct Block : kiln::nn::Module {
  kiln::nn::LayerNorm ln_1, ln_2;
  kiln::nn::CausalSelfAttention attn;
  Mlp mlp;
  Block(const Config& c) : ln_1(c.n_embd), ln_2(c.n_embd), attn(c.n_embd, c.n_head, c.dropout), mlp(c) {
    register_module("ln_1", ln_1);
    register_module("attn", attn);
    register_module("ln_2", ln_2);
    register_module("mlp", mlp);
  }
  kiln::Tensor forward(const kiln::Tensor& x) override {
    kiln::Tensor y = x + attn(ln_1(x));
    return y + mlp(ln_2(y));
  }
};

struct Gpt : kiln::nn::Module {
  Config config;
  kiln::nn::Embedding wte, wpe;
  kiln::nn::ModuleList h;
  kiln::nn::LayerNorm ln_f;

  explicit Gpt(const Config& c) : config(c), wte(c.vocab_size, c.n_embd), wpe(c.block_size, c.n_embd), ln_f(c.n_embd) {
    for (std::int64_t i = 0; i < c.n_layer; ++i) h.push_back(Block(c));
    register_module("wte", wte);
    register_module("wpe", wpe);
    register_module("h", h);
    register_module("ln_f", ln_f);
    // GPT-2's initialisation: N(0, 0.02) weights, zero biases, the residual projections
    // scaled by 1/sqrt(2 n_layer).
    for (auto& [name, p] : named_parameters()) {
      if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0 && p.dim() == 1 &&
          name.find("ln_") == std::string::npos) {
        kiln::nn::init::zeros_(p);
      } else if (p.dim() == 2) {
        const bool residual = name.find("c_proj.weight") != std::string::npos;
        kiln::nn::init::normal_(p, 0.0, residual ? 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer)) : 0.02);
      }
    }
  }

  /// Logits [B, T, vocab] of token ids `idx` [B, T] (int64).
  kiln::Tensor forward(const kiln::Tensor& idx) override {
    const std::int64_t T = idx.shape()[1];
    kiln::Tensor pos = kiln::arange(T, kiln::DType::Int64, idx.device());
    kiln::Tensor x = wte(idx) + wpe(pos);
    for (std::size_t i = 0; i < h.size(); ++i) x = h[i](x);
    x = ln_f(x);
    return kiln::matmul(x, kiln::transpose(wte.weight, 0, 1));  // the head tied to wte
  }

  /// Mean next-token cross-entropy of `logits` [B, T, V] against `targets` [B, T].
  static kiln::Tensor loss(const kiln::Tensor& logits, const kiln::Tensor& targets) {
    const std::int64_t V = logits.shape()[2], N = logits.shape()[0] * logits.shape()[1];
    return kiln::cross_entropy(kiln::reshape(logits, {N, V}), kiln::reshape(targets, {N}));
  }
};

/// A small GPT's configuration: `n_layer` blocks of width `n_embd` with `n_head` heads over a
/// vocabulary of `vocab_size` and sequences of up to `block_size`, no dropout.
inline Config small_config(std::int64_t vocab_size, std::int64_t block_size, std::int64_t n_layer,
                           std::int64_t n_head, std::int64_t n_embd) {
  Config c;
  c.vocab_size = vocab_size;
  c.block_size = block_size;
  c.n_layer = n_layer;
  c.n_head = n_head;
  c.n_embd = n_embd;
  return c;
}

/// A batch a small model learns in a few dozen steps: B sequences of T tokens that count up by
/// one modulo `vocab`, row b starting at `stride * b`; the targets are the inputs shifted by one.
/// Returns {inputs, targets}, both int64 [B, T] on `device`.
inline std::pair<kiln::Tensor, kiln::Tensor> counting_batch(std::int64_t B, std::int64_t T, std::int64_t vocab,
                                                            std::int64_t stride,
                                                            kiln::Device device = kiln::Device::cpu()) {
  std::vector<std::int64_t> xs, ys;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t) {
      xs.push_back((stride * b + t) % vocab);
      ys.push_back((stride * b + t + 1) % vocab);
    }
  return {kiln::from_vector(xs, {B, T}, device), kiln::from_vector(ys, {B, T}, device)};
}

}  // namespace gpt
