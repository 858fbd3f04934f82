// kiln's side of autocast_torch.py: the result dtype of each op under an AutocastGuard, in the
// same lines (`op autocast_dtype input_dtype result_dtype`, ERR where kiln refuses). The guard
// applies to every device, so this runs on the CPU:
//   c++ -std=c++20 -O0 -Iinclude tests/torch_diff/autocast_kiln.cpp -o autocast_kiln -ldl -pthread
#include <kiln/kiln.hpp>
#include <cstdio>
#include <functional>
#include <map>
using namespace kiln;
namespace F = kiln::nn::functional;
int main() {
  for (DType adt : {f16, bf16})
    for (DType idt : {f32, f16}) {
      manual_seed(0);
      Tensor x = (rand({4, 4}) + 0.5).to(idt).eval(), y = (rand({4, 4}) + 0.5).to(idt).eval();
      Tensor v = rand({4}).to(idt).eval(), t = from_vector<double>({1, -1, 1, -1}, {4}).to(idt).eval();
      Tensor c = (rand({4, 4}) + 0.5).eval();
      Tensor lab = from_vector<std::int64_t>({0, 3, 1, 2}, {4});
      std::vector<std::pair<std::string, std::function<Tensor()>>> ops = {
          {"matmul", [&] { return matmul(x, y); }},
          {"linear", [&] { return F::linear(x, y, v); }},
          {"addmm", [&] { return addmm(v, x, y); }},
          {"mm", [&] { return mm(x, y); }},
          {"bmm", [&] { return bmm(unsqueeze(x, 0), unsqueeze(y, 0)); }},
          {"einsum", [&] { return einsum("ij,jk->ik", x, y); }},
          {"sdpa",
           [&] {
             return F::scaled_dot_product_attention(reshape(x, {1, 1, 4, 4}), reshape(y, {1, 1, 4, 4}),
                                                    reshape(x, {1, 1, 4, 4}));
           }},
          {"tensordot", [&] { return tensordot(x, y, 1); }},
          {"outer", [&] { return outer(v, v); }},
          {"dot", [&] { return dot(v, v); }},
          {"norm", [&] { return norm(x); }},
          {"index_put", [&] { return index_put(x, {lab}, select(c, 0, 0)); }},
          {"kron", [&] { return kron(x, y); }},
          {"cdist", [&] { return cdist(x, y); }},
          {"dist", [&] { return dist(x, y); }},
          {"pdist", [&] { return F::pdist(x); }},
          {"exp", [&] { return exp(x); }},
          {"log10", [&] { return log10(x); }},
          {"erfinv", [&] { return erfinv(x / 10.0); }},
          {"softplus", [&] { return softplus(x); }},
          {"sqrt", [&] { return sqrt(x); }},
          {"sin", [&] { return sin(x); }},
          {"lgamma", [&] { return lgamma(x); }},
          {"digamma", [&] { return digamma(x); }},
          {"erfc", [&] { return erfc(x); }},
          {"sigmoid", [&] { return sigmoid(x); }},
          {"sum", [&] { return sum(x); }},
          {"mean", [&] { return mean(x); }},
          {"prod", [&] { return prod(x); }},
          {"cumsum", [&] { return cumsum(x, 0); }},
          {"std", [&] { return kiln::std(x); }},
          {"var", [&] { return var(x); }},
          {"logsumexp", [&] { return logsumexp(x, {0}); }},
          {"softmax", [&] { return softmax(x, 0); }},
          {"log_softmax", [&] { return log_softmax(x, 0); }},
          {"softmin", [&] { return softmin(x, 0); }},
          {"vector_norm", [&] { return linalg::vector_norm(x); }},
          {"normalize", [&] { return F::normalize(x); }},
          {"layer_norm", [&] { return F::layer_norm(x, Shape{4}); }},
          {"rms_norm", [&] { return F::rms_norm(x, Shape{4}); }},
          {"cosine_similarity", [&] { return F::cosine_similarity(x, y); }},
          {"pairwise_distance", [&] { return pairwise_distance(x, y); }},
          {"mse_loss", [&] { return mse_loss(x, y); }},
          {"l1_loss", [&] { return l1_loss(x, y); }},
          {"smooth_l1_loss", [&] { return smooth_l1_loss(x, y); }},
          {"huber_loss", [&] { return huber_loss(x, y); }},
          {"bce_logits", [&] { return binary_cross_entropy_with_logits(x, sigmoid(y)); }},
          {"kl_div", [&] { return kl_div(x, y); }},
          {"margin_ranking_loss", [&] { return margin_ranking_loss(v, v * 2.0, t); }},
          {"soft_margin_loss", [&] { return soft_margin_loss(x, sign(y)); }},
          {"hinge_embedding_loss", [&] { return hinge_embedding_loss(x, sign(y)); }},
          {"poisson_nll_loss", [&] { return poisson_nll_loss(x, abs(y)); }},
          {"gaussian_nll_loss", [&] { return gaussian_nll_loss(x, y, abs(y) + 1.0); }},
          {"cosine_embedding_loss", [&] { return cosine_embedding_loss(x, y, t); }},
          {"triplet_margin_loss", [&] { return triplet_margin_loss(x, y, x * 2.0); }},
          {"multilabel_soft_margin_loss", [&] { return multilabel_soft_margin_loss(x, (y > 0).to(x.dtype())); }},
          {"multi_margin_loss", [&] { return multi_margin_loss(x, lab); }},
          {"cross_entropy", [&] { return cross_entropy(x, lab); }},
          {"nll_loss", [&] { return nll_loss(x, lab); }},
          {"addcmul", [&] { return addcmul(x, y, c); }},
          {"addcdiv", [&] { return addcdiv(x, y, c + 3.0); }},
          {"atan2", [&] { return atan2(x, c); }},
          {"cat",
           [&] {
             return concat({x, c}, 0);
           }},
          {"stack",
           [&] {
             return stack({x, c}, 0);
           }},
          {"scatter_add",
           [&] {
             return scatter_add(x, 0, broadcast_to(unsqueeze(lab, 0), {4, 4}), c);
           }},
          {"cross", [&] { return linalg::cross(slice(x, 1, 0, 3), slice(c, 1, 0, 3)); }},
          {"pow", [&] { return pow(x, 2.5); }},
          {"rpow", [&] { return pow(2.0, x); }},
          {"div_num", [&] { return 2.0 / x; }},
          {"square", [&] { return square(x); }},
          {"gelu", [&] { return gelu(x); }},
          {"silu", [&] { return silu(x); }},
          {"mul", [&] { return x * c; }},
          {"add_mixed", [&] { return x + c; }},
          {"logaddexp", [&] { return logaddexp(x, y); }},
          {"xlogy", [&] { return xlogy(x, abs(y)); }},
          {"lerp", [&] { return lerp(x, y, 0.3); }},
          {"cumprod", [&] { return cumprod(x, 0); }},
          {"logcumsumexp", [&] { return logcumsumexp(x, 0); }},
          {"trace", [&] { return trace(x); }},
          {"diff", [&] { return diff(x); }},
          {"cov", [&] { return cov(x); }},
          {"quantile", [&] { return quantile(x, 0.5); }},
          {"median", [&] { return median(x); }},
      };
      for (auto& [name, f] : ops) {
        std::string r;
        try {
          AutocastGuard amp(adt);
          r = dtype_name(f().dtype());
        } catch (const std::exception& e) {
          r = "ERR";
        }
        std::printf("%s %s %s %s\n", name.c_str(), dtype_name(adt), dtype_name(idt), r.c_str());
      }
    }
}
