// The kiln side of scripts/torch-diff (docs/fuzzing.md, "Against PyTorch"): reads cases from
// stdin, one per line, `CASE id op nargs args...`, each arg `t dtype noncontiguous ndim dims...
// values...` (a tensor), `f x`, `i n`, `s word`, `l n v...` or `n` (an undefined tensor); an op
// named `grad:op` makes the float32/float64 tensors leaves and prints the gradients of
// sum(op(...)[0] * cotangent), the cotangent being the last argument. Prints `RES id n (T dtype
// ndim dims... values...)*` or `ERR id message` per case. KILN_DEVICE=cuda puts every tensor
// argument on the GPU (the ops that create tensors from numbers alone stay on the CPU).
#include <kiln/kiln.hpp>
#include "../support/device.hpp"
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
using namespace kiln;
struct Arg { char kind; Tensor t; double f = 0; int64_t i = 0; std::vector<int64_t> l; std::string s; };
DType parse_dtype(const std::string& s) {
  static std::map<std::string, DType> m = {{"float32", f32}, {"float64", f64}, {"float16", f16}, {"bfloat16", bf16},
                                           {"int32", i32}, {"int64", i64}, {"bool", DType::Bool}};
  return m.at(s);
}
Tensor read_tensor(std::istream& in) {
  std::string dt; int nd; int nc; in >> dt >> nc >> nd; Shape sh; std::vector<int64_t> dims(nd);
  for (auto& d : dims) in >> d;
  int64_t n = 1; for (auto d : dims) n *= d;
  std::vector<double> v(n); for (auto& x : v) { std::string s; in >> s; x = std::stod(s); }
  DType dtype = parse_dtype(dt);
  if (nc && nd >= 2) {  // stored transposed in the last two dims, then viewed back
    std::vector<int64_t> td = dims; std::swap(td[nd - 1], td[nd - 2]);
    int64_t R = dims[nd - 2], C = dims[nd - 1], B = n / (R * C > 0 ? R * C : 1);
    std::vector<double> w(n);
    if (R * C > 0) for (int64_t b = 0; b < B; ++b) for (int64_t r = 0; r < R; ++r) for (int64_t c = 0; c < C; ++c) w[b * R * C + c * R + r] = v[b * R * C + r * C + c];
    Tensor t = from_vector<double>(w, Shape(td)).to(dtype).to(kiln::testing::device()).eval();
    return transpose(t, -1, -2);
  }
  return from_vector<double>(v, Shape(dims)).to(dtype).to(kiln::testing::device()).eval();
}
int main() {
  std::string tok;
  using A = std::vector<Arg>;
  using R = std::vector<Tensor>;
  auto T = [](A& a, int k) -> Tensor& { return a.at(k).t; };
  std::map<std::string, std::function<R(A&)>> ops;
#define U(name) ops[#name] = [&](A& a) -> R { return {Tensor(name(T(a, 0)))}; };
  ops["neg"] = [&](A& a) -> R { return {Tensor(-T(a, 0))}; };
  U(abs) U(exp) U(exp2) U(log) U(log2) U(log1p) U(expm1) U(sqrt) U(rsqrt) U(sin) U(cos) U(tan) U(tanh) U(erf)
  U(floor) U(ceil) U(round) U(logical_not) U(isnan) U(isinf) U(sigmoid) U(relu) U(silu) U(atan) U(asin) U(acos)
  U(sinh) U(cosh) U(asinh) U(acosh) U(atanh) U(reciprocal) U(sign) U(square) U(trunc) U(bitwise_not)
  U(isfinite) U(isposinf) U(isneginf) U(log10) U(frac) U(deg2rad) U(rad2deg) U(flipud) U(fliplr)
#define B(name) ops[#name] = [&](A& a) -> R { \
    if (a[1].kind == 't') return {Tensor(name(T(a, 0), T(a, 1)))}; \
    if (a[1].kind == 'f') return {Tensor(name(T(a, 0), a[1].f))}; \
    return {Tensor(name(T(a, 0), a[1].i))}; };
  B(add) B(sub) B(mul) B(div) B(pow) B(maximum) B(minimum) B(eq) B(ne) B(lt) B(le) B(gt) B(ge) B(logical_and)
  B(logical_or) B(logical_xor) B(atan2) B(hypot) B(fmod) B(remainder) B(bitwise_and) B(bitwise_or) B(bitwise_xor)
  B(left_shift) B(right_shift)
  ops["gelu"] = [&](A& a) -> R { return {gelu(T(a, 0), a[1].i != 0)}; };
  ops["leaky_relu"] = [&](A& a) -> R { return {leaky_relu(T(a, 0), a[1].f)}; };
  ops["elu"] = [&](A& a) -> R { return {elu(T(a, 0), a[1].f)}; };
  ops["celu"] = [&](A& a) -> R { return {celu(T(a, 0), a[1].f)}; };
  ops["softplus"] = [&](A& a) -> R { return {softplus(T(a, 0), a[1].f, a[2].f)}; };
  ops["hardtanh"] = [&](A& a) -> R { return {hardtanh(T(a, 0), a[1].f, a[2].f)}; };
  U(selu) U(mish) U(relu6) U(hardsigmoid) U(hardswish) U(logsigmoid) U(softsign) U(tanhshrink)
  ops["where"] = [&](A& a) -> R { return {Tensor(where(T(a, 0), T(a, 1), T(a, 2)))}; };
  ops["clamp"] = [&](A& a) -> R { return {Tensor(clamp(T(a, 0), a[1].f, a[2].f))}; };
#define RED(name) ops[#name] = [&](A& a) -> R { return {name(T(a, 0), Axes(a[1].l), a[2].i != 0)}; };
  RED(sum) RED(prod) RED(mean) RED(amax) RED(amin) RED(logsumexp)
  ops["max_all"] = [&](A& a) -> R { return {max(T(a, 0))}; };
  ops["min_all"] = [&](A& a) -> R { return {min(T(a, 0))}; };
  ops["max_dim"] = [&](A& a) -> R { auto r = max(T(a, 0), a[1].i, a[2].i != 0); return {r.values(), r.indices()}; };
  ops["min_dim"] = [&](A& a) -> R { auto r = min(T(a, 0), a[1].i, a[2].i != 0); return {r.values(), r.indices()}; };
  ops["argmax"] = [&](A& a) -> R { return {argmax(T(a, 0), a[1].l.empty() ? Axes{} : Axes(a[1].l), a[2].i != 0)}; };
  ops["argmin"] = [&](A& a) -> R { return {argmin(T(a, 0), a[1].l.empty() ? Axes{} : Axes(a[1].l), a[2].i != 0)}; };
  ops["var"] = [&](A& a) -> R { return {var(T(a, 0), Axes(a[1].l), a[2].i != 0, a[3].f)}; };
  ops["softmax"] = [&](A& a) -> R { return {softmax(T(a, 0), a[1].i)}; };
  ops["log_softmax"] = [&](A& a) -> R { return {log_softmax(T(a, 0), a[1].i)}; };
  ops["layer_norm"] = [&](A& a) -> R { return {layer_norm(T(a, 0), T(a, 1), T(a, 2), a[3].f)}; };
  ops["rms_norm"] = [&](A& a) -> R { return {rms_norm(T(a, 0), T(a, 1))}; };
  ops["layer_norm_ns"] = [&](A& a) -> R {
    return {nn::functional::layer_norm(T(a, 0), Shape(a[1].l), T(a, 2), T(a, 3), a[4].f)}; };
  ops["rms_norm_ns"] = [&](A& a) -> R { return {nn::functional::rms_norm(T(a, 0), Shape(a[1].l), T(a, 2), a[3].f)}; };
  ops["cross_entropy"] = [&](A& a) -> R { return {cross_entropy(T(a, 0), T(a, 1), a[2].i)}; };
  ops["cumsum"] = [&](A& a) -> R { return {cumsum(T(a, 0), a[1].i)}; };
  ops["cumprod"] = [&](A& a) -> R { return {cumprod(T(a, 0), a[1].i)}; };
  ops["cummax"] = [&](A& a) -> R { auto [v, i] = cummax(T(a, 0), a[1].i); return {v, i}; };
  ops["cummin"] = [&](A& a) -> R { auto [v, i] = cummin(T(a, 0), a[1].i); return {v, i}; };
  ops["logcumsumexp"] = [&](A& a) -> R { return {logcumsumexp(T(a, 0), a[1].i)}; };
  ops["sort"] = [&](A& a) -> R { auto [v, i] = sort(T(a, 0), a[1].i, a[2].i != 0, true); return {v, i}; };
  ops["argsort"] = [&](A& a) -> R { return {argsort(T(a, 0), a[1].i, a[2].i != 0, true)}; };
  ops["topk"] = [&](A& a) -> R { auto [v, i] = topk(T(a, 0), a[1].i, a[2].i, a[3].i != 0, true); return {v, i}; };
  ops["gather"] = [&](A& a) -> R { return {gather(T(a, 0), a[1].i, T(a, 2))}; };
  ops["index_select"] = [&](A& a) -> R { return {index_select(T(a, 0), a[1].i, T(a, 2))}; };
  ops["take_along_dim"] = [&](A& a) -> R { return {take_along_dim(T(a, 0), T(a, 1), a[2].i)}; };
  ops["embedding"] = [&](A& a) -> R { return {embedding(T(a, 0), T(a, 1))}; };
  ops["scatter"] = [&](A& a) -> R {
    if (a[3].kind == 'f') return {scatter(T(a, 0), a[1].i, T(a, 2), a[3].f)};
    return {scatter(T(a, 0), a[1].i, T(a, 2), T(a, 3))}; };
  ops["scatter_add"] = [&](A& a) -> R { return {scatter_add(T(a, 0), a[1].i, T(a, 2), T(a, 3))}; };
  ops["index_add"] = [&](A& a) -> R { return {index_add(T(a, 0), a[1].i, T(a, 2), T(a, 3))}; };
  ops["masked_fill"] = [&](A& a) -> R { return {masked_fill(T(a, 0), T(a, 1), a[2].f)}; };
  ops["tril"] = [&](A& a) -> R { return {tril(T(a, 0), a[1].i)}; };
  ops["triu"] = [&](A& a) -> R { return {triu(T(a, 0), a[1].i)}; };
  ops["flip"] = [&](A& a) -> R { return {flip(T(a, 0), a[1].l)}; };
  ops["roll"] = [&](A& a) -> R { return {roll(T(a, 0), a[1].l, a[2].l)}; };
  ops["repeat"] = [&](A& a) -> R { return {repeat(T(a, 0), a[1].l)}; };
  ops["pad"] = [&](A& a) -> R { return {pad(T(a, 0), a[1].l, a[2].s, a[3].f)}; };
  ops["one_hot"] = [&](A& a) -> R { return {one_hot(T(a, 0), a[1].i)}; };
  ops["stack"] = [&](A& a) -> R { return {stack({T(a, 0), T(a, 1)}, a[2].i)}; };
  ops["cat"] = [&](A& a) -> R { return {concat({T(a, 0), T(a, 1)}, a[2].i)}; };
  ops["matmul"] = [&](A& a) -> R { return {matmul(T(a, 0), T(a, 1))}; };
  ops["linear"] = [&](A& a) -> R { return {linear(T(a, 0), T(a, 1), T(a, 2))}; };
  ops["to"] = [&](A& a) -> R { return {T(a, 0).to(parse_dtype(a[1].s))}; };
  ops["unsqueeze"] = [&](A& a) -> R { return {unsqueeze(T(a, 0), a[1].i)}; };
  ops["chunk"] = [&](A& a) -> R { return chunk(T(a, 0), a[1].i, a[2].i); };
  ops["split"] = [&](A& a) -> R { return split(T(a, 0), a[1].i, a[2].i); };
  ops["mse_loss"] = [&](A& a) -> R { return {mse_loss(T(a, 0), T(a, 1), a[2].s)}; };
  ops["l1_loss"] = [&](A& a) -> R { return {l1_loss(T(a, 0), T(a, 1), a[2].s)}; };
  ops["smooth_l1_loss"] = [&](A& a) -> R { return {smooth_l1_loss(T(a, 0), T(a, 1), a[2].s, a[3].f)}; };
  ops["huber_loss"] = [&](A& a) -> R { return {huber_loss(T(a, 0), T(a, 1), a[2].s, a[3].f)}; };
  ops["bce"] = [&](A& a) -> R { return {binary_cross_entropy(T(a, 0), T(a, 1), a[2].s)}; };
  ops["bcel"] = [&](A& a) -> R { return {binary_cross_entropy_with_logits(T(a, 0), T(a, 1), a[2].s)}; };
  ops["ce_opts"] = [&](A& a) -> R { return {cross_entropy(T(a, 0), T(a, 1), {.ignore_index = a[2].i, .reduction = a[3].s, .label_smoothing = a[4].f})}; };
  ops["nll_loss"] = [&](A& a) -> R { return {nll_loss(T(a, 0), T(a, 1), a[2].i, a[3].s)}; };
  ops["index_copy"] = [&](A& a) -> R { return {index_copy(T(a, 0), a[1].i, T(a, 2), T(a, 3))}; };
  ops["arange"] = [&](A& a) -> R {
    const bool integral = a[0].kind == 'i';
    const double st = integral ? static_cast<double>(a[0].i) : a[0].f,
                 en = integral ? static_cast<double>(a[1].i) : a[1].f,
                 step = integral ? static_cast<double>(a[2].i) : a[2].f;
    if (a[3].kind == 's') {
      const DType d = parse_dtype(a[3].s);
      return {integral ? arange(a[0].i, a[1].i, a[2].i, d) : arange(st, en, step, d)};
    }
    return {integral ? arange(a[0].i, a[1].i, a[2].i) : arange(st, en, step)};
  };
  ops["squeeze_dim"] = [&](A& a) -> R { return {squeeze(T(a, 0), a[1].i)}; };
  ops["flatten"] = [&](A& a) -> R { return {flatten(T(a, 0), a[1].i, a[2].i)}; };
  ops["unflatten"] = [&](A& a) -> R { return {unflatten(T(a, 0), a[1].i, a[2].l)}; };
  ops["narrow"] = [&](A& a) -> R { return {narrow(T(a, 0), a[1].i, a[2].i, a[3].i)}; };
  ops["select"] = [&](A& a) -> R { return {select(T(a, 0), a[1].i, a[2].i)}; };
  ops["permute"] = [&](A& a) -> R { return {permute(T(a, 0), a[1].l)}; };
  ops["swapaxes"] = [&](A& a) -> R { return {swapaxes(T(a, 0), a[1].i, a[2].i)}; };
  ops["unbind"] = [&](A& a) -> R { return unbind(T(a, 0), a[1].i); };
  ops["mm"] = [&](A& a) -> R { return {mm(T(a, 0), T(a, 1))}; };
  ops["bmm"] = [&](A& a) -> R { return {bmm(T(a, 0), T(a, 1))}; };
  ops["mv"] = [&](A& a) -> R { return {mv(T(a, 0), T(a, 1))}; };
  ops["dot"] = [&](A& a) -> R { return {dot(T(a, 0), T(a, 1))}; };
  ops["addmm"] = [&](A& a) -> R { return {addmm(T(a, 0), T(a, 1), T(a, 2), a[3].f, a[4].f)}; };
  ops["baddbmm"] = [&](A& a) -> R { return {baddbmm(T(a, 0), T(a, 1), T(a, 2), a[3].f, a[4].f)}; };
  ops["einsum"] = [&](A& a) -> R {
    return {a.size() == 2 ? einsum(a[0].s, T(a, 1)) : einsum(a[0].s, T(a, 1), T(a, 2))};
  };
  ops["reshape"] = [&](A& a) -> R { return {reshape(T(a, 0), Shape(a[1].l))}; };
  ops["broadcast_to"] = [&](A& a) -> R { return {broadcast_to(T(a, 0), Shape(a[1].l))}; };
  ops["transpose"] = [&](A& a) -> R { return {transpose(T(a, 0), a[1].i, a[2].i)}; };
  ops["squeeze"] = [&](A& a) -> R { return {squeeze(T(a, 0))}; };
  ops["msort"] = [&](A& a) -> R { return {msort(T(a, 0))}; };
  ops["norm"] = [&](A& a) -> R { return {norm(T(a, 0), a[1].f, Axes(a[2].l), a[3].i != 0)}; };
  ops["heaviside"] = [&](A& a) -> R { return {heaviside(T(a, 0), T(a, 1))}; };
  ops["index_put"] = [&](A& a) -> R {
    std::vector<Tensor> idx;
    for (std::size_t i = 1; i + 2 < a.size(); ++i) idx.push_back(T(a, i));
    return {index_put(T(a, 0), idx, T(a, a.size() - 2), a.back().i != 0)};
  };
  ops["index_fill"] = [&](A& a) -> R {
    return {a[3].kind == 't' ? index_fill(T(a, 0), a[1].i, T(a, 2), T(a, 3))
                             : index_fill(T(a, 0), a[1].i, T(a, 2), a[3].f)};
  };
  ops["masked_scatter"] = [&](A& a) -> R { return {masked_scatter(T(a, 0), T(a, 1), T(a, 2))}; };
  ops["take_flat"] = [&](A& a) -> R { return {take_along_dim(T(a, 0), T(a, 1), std::nullopt)}; };
  ops["clamp_t"] = [&](A& a) -> R { return {clamp(T(a, 0), T(a, 1), T(a, 2))}; };
  ops["where_s"] = [&](A& a) -> R { return {Tensor(where(T(a, 0), T(a, 1), a[2].f))}; };
  ops["neg2"] = [&](A& a) -> R { return {Tensor(neg(T(a, 0)))}; };
  ops["sdpa"] = [&](A& a) -> R {
    std::optional<double> scale;
    if (a[5].i) scale = a[6].f;
    return {scaled_dot_product_attention(T(a, 0), T(a, 1), T(a, 2), T(a, 3), 0.0, a[4].i != 0, scale, a[7].i != 0)};
  };
  // Common composites (tensor/composites.hpp, nn::functional).
  ops["all"] = [&](A& a) -> R { return {all(T(a, 0), Axes(a[1].l), a[2].i != 0)}; };
  ops["any"] = [&](A& a) -> R { return {any(T(a, 0), Axes(a[1].l), a[2].i != 0)}; };
  ops["count_nonzero"] = [&](A& a) -> R { return {count_nonzero(T(a, 0), Axes(a[1].l))}; };
  ops["vector_norm"] = [&](A& a) -> R { return {linalg::vector_norm(T(a, 0), a[1].f, Axes(a[2].l), a[3].i != 0)}; };
  ops["eye"] = [&](A& a) -> R { return {eye(a[0].i, a[1].i, parse_dtype(a[2].s))}; };
  ops["linspace"] = [&](A& a) -> R { return {linspace(a[0].f, a[1].f, a[2].i, parse_dtype(a[3].s))}; };
  ops["lerp"] = [&](A& a) -> R { return {lerp(T(a, 0), T(a, 1), a[2].f)}; };
  ops["lerp_t"] = [&](A& a) -> R { return {lerp(T(a, 0), T(a, 1), T(a, 2))}; };
  ops["addcmul"] = [&](A& a) -> R { return {addcmul(T(a, 0), T(a, 1), T(a, 2), a[3].f)}; };
  ops["addcdiv"] = [&](A& a) -> R { return {addcdiv(T(a, 0), T(a, 1), T(a, 2), a[3].f)}; };
  ops["logaddexp"] = [&](A& a) -> R { return {logaddexp(T(a, 0), T(a, 1))}; };
  ops["nan_to_num"] = [&](A& a) -> R {
    std::optional<double> p, n;
    if (a[2].kind == 'f') p = a[2].f;
    if (a[3].kind == 'f') n = a[3].f;
    return {nan_to_num(T(a, 0), a[1].f, p, n)};
  };
  ops["clamp_min"] = [&](A& a) -> R { return {a[1].kind == 'i' ? clamp_min(T(a, 0), a[1].i) : clamp_min(T(a, 0), a[1].f)}; };
  ops["clamp_max"] = [&](A& a) -> R { return {a[1].kind == 'i' ? clamp_max(T(a, 0), a[1].i) : clamp_max(T(a, 0), a[1].f)}; };
  ops["clamp_min_t"] = [&](A& a) -> R { return {clamp_min(T(a, 0), T(a, 1))}; };
  ops["logit"] = [&](A& a) -> R {
    std::optional<double> eps;
    if (a[1].kind == 'f') eps = a[1].f;
    return {logit(T(a, 0), eps)};
  };
  ops["outer"] = [&](A& a) -> R { return {outer(T(a, 0), T(a, 1))}; };
  ops["nansum"] = [&](A& a) -> R { return {nansum(T(a, 0), Axes(a[1].l), a[2].i != 0)}; };
  ops["nanmean"] = [&](A& a) -> R { return {nanmean(T(a, 0), Axes(a[1].l), a[2].i != 0)}; };
  ops["fmax"] = [&](A& a) -> R { return {fmax(T(a, 0), T(a, 1))}; };
  ops["fmin"] = [&](A& a) -> R { return {fmin(T(a, 0), T(a, 1))}; };
  ops["xlogy"] = [&](A& a) -> R { return {xlogy(T(a, 0), T(a, 1))}; };
  ops["isclose"] = [&](A& a) -> R { return {isclose(T(a, 0), T(a, 1), a[2].f, a[3].f, a[4].i != 0)}; };
  ops["aminmax"] = [&](A& a) -> R {
    auto [lo, hi] = aminmax(T(a, 0), Axes(a[1].l), a[2].i != 0);
    return {lo, hi};
  };
  ops["tile"] = [&](A& a) -> R { return {tile(T(a, 0), a[1].l)}; };
  ops["quantile"] = [&](A& a) -> R {
    std::optional<std::int64_t> dim;
    if (!a[2].l.empty()) dim = a[2].l[0];
    return {quantile(T(a, 0), a[1].f, dim, a[3].i != 0, a[4].s)};
  };
  ops["rot90"] = [&](A& a) -> R { return {rot90(T(a, 0), a[1].i, a[2].l)}; };
  ops["repeat_interleave"] = [&](A& a) -> R {
    std::optional<std::int64_t> dim;
    if (!a[2].l.empty()) dim = a[2].l[0];
    return {repeat_interleave(T(a, 0), a[1].i, dim)};
  };
  U(signbit)
  U(erfc)
  U(lgamma) U(digamma) U(erfinv) U(sgn) B(floor_divide) B(copysign) B(float_power)
      ops["logaddexp2"] = [&](A& a) -> R { return {logaddexp2(T(a, 0), T(a, 1))}; };
  ops["div_mode"] = [&](A& a) -> R { return {div(T(a, 0), T(a, 1), std::string_view(a[2].s))}; };
  ops["std"] = [&](A& a) -> R { return {kiln::std(T(a, 0), Axes(a[1].l), a[2].i != 0, a[3].f)}; };
  ops["nanmedian"] = [&](A& a) -> R { return {nanmedian(T(a, 0))}; };
  ops["nanmedian_dim"] = [&](A& a) -> R {
    auto r = nanmedian(T(a, 0), a[1].i, a[2].i != 0);
    return {r.values(), r.indices()};
  };
  ops["nanquantile"] = [&](A& a) -> R {
    std::optional<std::int64_t> dim;
    if (!a[2].l.empty()) dim = a[2].l[0];
    return {nanquantile(T(a, 0), a[1].f, dim, a[3].i != 0, a[4].s)};
  };
  ops["kthvalue"] = [&](A& a) -> R {
    auto r = kthvalue(T(a, 0), a[1].i, a[2].i, a[3].i != 0);
    return {r.values(), r.indices()};
  };
  ops["searchsorted"] = [&](A& a) -> R {
    std::optional<std::string> side;
    if (a[4].kind == 's') side = a[4].s;
    return {searchsorted(T(a, 0), T(a, 1), a[2].i != 0, a[3].i != 0, side)};
  };
  ops["bucketize"] = [&](A& a) -> R { return {bucketize(T(a, 0), T(a, 1), a[2].i != 0, a[3].i != 0)}; };
  ops["cov"] = [&](A& a) -> R { return {cov(T(a, 0), a[1].i, T(a, 2), T(a, 3))}; };
  ops["corrcoef"] = [&](A& a) -> R { return {corrcoef(T(a, 0))}; };
  ops["histc"] = [&](A& a) -> R { return {histc(T(a, 0), a[1].i, a[2].f, a[3].f)}; };
  ops["softshrink"] = [&](A& a) -> R { return {softshrink(T(a, 0), a[1].f)}; };
  ops["hardshrink"] = [&](A& a) -> R { return {hardshrink(T(a, 0), a[1].f)}; };
  ops["margin_ranking_loss"] = [&](A& a) -> R {
    return {margin_ranking_loss(T(a, 0), T(a, 1), T(a, 2), a[3].f, a[4].s)};
  };
  ops["soft_margin_loss"] = [&](A& a) -> R { return {soft_margin_loss(T(a, 0), T(a, 1), a[2].s)}; };
  ops["hinge_embedding_loss"] = [&](A& a) -> R { return {hinge_embedding_loss(T(a, 0), T(a, 1), a[2].f, a[3].s)}; };
  ops["poisson_nll_loss"] = [&](A& a) -> R {
    return {poisson_nll_loss(T(a, 0), T(a, 1), a[2].i != 0, a[3].i != 0, a[4].f, a[5].s)};
  };
  ops["gaussian_nll_loss"] = [&](A& a) -> R {
    return {gaussian_nll_loss(T(a, 0), T(a, 1), T(a, 2), a[3].i != 0, a[4].f, a[5].s)};
  };
  ops["cosine_embedding_loss"] = [&](A& a) -> R {
    return {cosine_embedding_loss(T(a, 0), T(a, 1), T(a, 2), a[3].f, a[4].s)};
  };
  ops["triplet_margin_loss"] = [&](A& a) -> R {
    return {triplet_margin_loss(T(a, 0), T(a, 1), T(a, 2), a[3].f, a[4].f, a[5].f, a[6].i != 0, a[7].s)};
  };
  ops["multilabel_soft_margin_loss"] = [&](A& a) -> R {
    return {multilabel_soft_margin_loss(T(a, 0), T(a, 1), T(a, 2), a[3].s)};
  };
  ops["multi_margin_loss"] = [&](A& a) -> R {
    return {multi_margin_loss(T(a, 0), T(a, 1), a[2].i, a[3].f, T(a, 4), a[5].s)};
  };
  ops["pairwise_distance"] = [&](A& a) -> R {
    return {pairwise_distance(T(a, 0), T(a, 1), a[2].f, a[3].f, a[4].i != 0)};
  };
  ops["pdist"] = [&](A& a) -> R { return {nn::functional::pdist(T(a, 0), a[1].f)}; };
  ops["tensordot"] = [&](A& a) -> R { return {tensordot(T(a, 0), T(a, 1), a[2].l, a[3].l)}; };
  ops["kron"] = [&](A& a) -> R { return {kron(T(a, 0), T(a, 1))}; };
  ops["cdist"] = [&](A& a) -> R { return {cdist(T(a, 0), T(a, 1), a[2].f)}; };
  ops["dist"] = [&](A& a) -> R { return {dist(T(a, 0), T(a, 1), a[2].f)}; };
  ops["block_diag"] = [&](A& a) -> R { return {block_diag({T(a, 0), T(a, 1), T(a, 2)})}; };
  ops["diag_embed"] = [&](A& a) -> R { return {diag_embed(T(a, 0), a[1].i, a[2].i, a[3].i)}; };
  ops["diagflat"] = [&](A& a) -> R { return {diagflat(T(a, 0), a[1].i)}; };
  ops["dstack"] = [&](A& a) -> R { return {dstack({T(a, 0), T(a, 1)})}; };
  ops["column_stack"] = [&](A& a) -> R { return {column_stack({T(a, 0), T(a, 1)})}; };
  ops["cartesian_prod"] = [&](A& a) -> R { return {cartesian_prod({T(a, 0), T(a, 1)})}; };
  ops["vander"] = [&](A& a) -> R {
    std::optional<std::int64_t> n;
    if (!a[1].l.empty()) n = a[1].l[0];
    return {vander(T(a, 0), n, a[2].i != 0)};
  };
  ops["diff"] = [&](A& a) -> R { return {diff(T(a, 0), a[1].i, a[2].i, T(a, 3), T(a, 4))}; };
  ops["trapezoid"] = [&](A& a) -> R {
    return {a[1].kind == 't' ? trapezoid(T(a, 0), T(a, 1), a[2].i) : trapezoid(T(a, 0), a[1].f, a[2].i)};
  };
  ops["cumulative_trapezoid"] = [&](A& a) -> R {
    return {a[1].kind == 't' ? cumulative_trapezoid(T(a, 0), T(a, 1), a[2].i)
                             : cumulative_trapezoid(T(a, 0), a[1].f, a[2].i)};
  };
  ops["normalize"] = [&](A& a) -> R { return {nn::functional::normalize(T(a, 0), a[1].f, a[2].i, a[3].f)}; };
  ops["cosine_similarity"] = [&](A& a) -> R { return {nn::functional::cosine_similarity(T(a, 0), T(a, 1), a[2].i, a[3].f)}; };
  ops["glu"] = [&](A& a) -> R { return {nn::functional::glu(T(a, 0), a[1].i)}; };
  ops["var_mean"] = [&](A& a) -> R { auto [v, m] = var_mean(T(a, 0), Axes(a[1].l), a[2].i != 0, a[3].f); return {v, m}; };
  ops["std_mean"] = [&](A& a) -> R { auto [v, m] = std_mean(T(a, 0), Axes(a[1].l), a[2].i != 0, a[3].f); return {v, m}; };
  ops["median"] = [&](A& a) -> R { return {median(T(a, 0))}; };
  ops["median_dim"] = [&](A& a) -> R { auto r = median(T(a, 0), a[1].i, a[2].i != 0); return {r.values(), r.indices()}; };
  ops["nonzero"] = [&](A& a) -> R { return {nonzero(T(a, 0))}; };
  ops["masked_select"] = [&](A& a) -> R { return {masked_select(T(a, 0), T(a, 1))}; };
  ops["diag"] = [&](A& a) -> R { return {diag(T(a, 0), a[1].i)}; };
  ops["diagonal"] = [&](A& a) -> R { return {diagonal(T(a, 0), a[1].i, a[2].i, a[3].i)}; };
  ops["trace"] = [&](A& a) -> R { return {trace(T(a, 0))}; };
  ops["cross"] = [&](A& a) -> R { return {linalg::cross(T(a, 0), T(a, 1), a[2].i)}; };
  ops["softmin"] = [&](A& a) -> R { return {softmin(T(a, 0), a[1].i)}; };
  ops["kl_div"] = [&](A& a) -> R { return {kl_div(T(a, 0), T(a, 1), a[2].s, a[3].i != 0)}; };
  ops["movedim"] = [&](A& a) -> R { return {movedim(T(a, 0), a[1].l, a[2].l)}; };
  ops["hstack"] = [&](A& a) -> R { return {hstack({T(a, 0), T(a, 1)})}; };
  ops["vstack"] = [&](A& a) -> R { return {vstack({T(a, 0), T(a, 1)})}; };
  ops["meshgrid"] = [&](A& a) -> R { return meshgrid({T(a, 0), T(a, 1), T(a, 2)}, a[3].s); };
  ops["tril_indices"] = [&](A& a) -> R { return {tril_indices(a[0].i, a[1].i, a[2].i)}; };
  ops["triu_indices"] = [&](A& a) -> R { return {triu_indices(a[0].i, a[1].i, a[2].i)}; };
  ops["unique"] = [&](A& a) -> R { auto [v, i, c] = unique(T(a, 0)); return {v, i, c}; };
  ops["unique_consecutive"] = [&](A& a) -> R { auto [v, i, c] = unique_consecutive(T(a, 0)); return {v, i, c}; };
  ops["where_cond"] = [&](A& a) -> R { return where(T(a, 0)); };
  ops["bincount"] = [&](A& a) -> R { return {bincount(T(a, 0), a[1].kind == 't' ? T(a, 1) : Tensor{}, a[2].i)}; };
  std::cout.precision(17);
  while (std::cin >> tok) {
    if (tok != "CASE") { std::cerr << "bad token " << tok << "\n"; return 2; }
    std::string id, op; int nargs; std::cin >> id >> op >> nargs;
    A args(nargs);
    for (auto& a : args) {
      std::cin >> a.kind;
      if (a.kind == 't') a.t = read_tensor(std::cin);
      else if (a.kind == 'f') { std::string s; std::cin >> s; a.f = std::stod(s); }
      else if (a.kind == 'i') std::cin >> a.i;
      else if (a.kind == 's') std::cin >> a.s;
      else if (a.kind == 'l') { int n; std::cin >> n; a.l.resize(n); for (auto& x : a.l) std::cin >> x; }
      else if (a.kind == 'n') {}  // an undefined tensor
    }
    try {
      bool grad_mode = op.rfind("grad:", 0) == 0;
      std::string name = grad_mode ? op.substr(5) : op;
      if (!ops.count(name)) throw std::runtime_error("harness: no op " + name);
      R r;
      if (grad_mode) {
        Tensor cot = args.back().t;
        args.pop_back();
        std::vector<Tensor> leaves;
        for (auto& a : args)
          if (a.kind == 't' && a.t.defined() && (a.t.dtype() == f32 || a.t.dtype() == f64)) {
            a.t = a.t.contiguous().eval().requires_grad_();
            leaves.push_back(a.t);
          }
        R out = ops[name](args);
        Tensor loss = sum(out[0] * cot);
        r = autograd::grad({loss}, leaves);
      } else {
        r = ops[name](args);
      }
      std::ostringstream os; os.precision(17);
      os << "RES " << id << " " << r.size();
      for (auto& t : r) {
        Tensor e = t.eval();
        os << " T " << dtype_name(e.dtype()) << " " << e.dim();
        for (auto d : e.shape()) os << " " << d;
        auto v = e.to(f64).to_vector<double>();
        for (double x : v) os << " " << x;
      }
      std::cout << os.str() << "\n";
    } catch (const std::exception& e) {
      std::string m = e.what(); for (auto& c : m) if (c == '\n') c = ' ';
      std::cout << "ERR " << id << " " << m << "\n";
    }
    std::cout.flush();
  }
}
