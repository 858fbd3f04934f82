#pragma once
// What the fuzzer's printed reproducers call: check_against_reference(program) evaluates the
// program once with the reference executor and once with the default backend (the JIT when a
// compiler is found) and checks that they agree, with the fuzzer's per-dtype tolerances.
#include <doctest/doctest.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "run.hpp"

namespace kiln::fuzz {

/// The outputs of program() read back, under backend `b`.
template <class F>
Result evaluate_with(F& program, Backend b) {
  Result r;
  Backend saved = get_backend();
  set_backend(b);
  try {
    std::vector<Tensor> outs = program();
    eval(outs);
    for (auto& o : outs) {
      r.values.push_back(read_values(o));
      r.infos.push_back({o.dtype(), o.shape()});
    }
  } catch (const std::exception& e) {
    r.status = Result::Status::EvalError;
    r.error_type = error_type(e);
    r.error = e.what();
  }
  set_backend(saved);
  return r;
}

/// `jit` (a run of the default backend) against `ref`, element by element.
inline void check_same(const Result& ref, const Result& jit) {
  REQUIRE_MESSAGE(ref.status == Result::Status::Ok, "reference: " << ref.error_type << ": " << ref.error);
  REQUIRE_MESSAGE(jit.status == Result::Status::Ok, "default backend: " << jit.error_type << ": " << jit.error);
  REQUIRE(jit.values.size() == ref.values.size());
  for (std::size_t o = 0; o < ref.values.size(); ++o) {
    CAPTURE(o);
    CHECK(dtype_name(jit.infos[o].dtype) == std::string(dtype_name(ref.infos[o].dtype)));
    CHECK(jit.infos[o].shape.str() == ref.infos[o].shape.str());
    if (jit.values[o].size() != ref.values[o].size()) continue;
    std::size_t bad = 0;
    std::string first;
    for (std::size_t i = 0; i < ref.values[o].size(); ++i)
      if (!element_close(jit.values[o][i], ref.values[o][i], 0, false, ref.infos[o].dtype)) {
        if (!bad++)
          first = "element " + std::to_string(i) + ": default backend " + num_str(jit.values[o][i]) + ", reference " +
                  num_str(ref.values[o][i]);
      }
    CHECK_MESSAGE(bad == 0, bad << " of " << ref.values[o].size() << " elements differ; " << first);
  }
}

/// Checks kiln::compile(program) (with `mode`, and dynamic = true when `dynamic`) against the
/// reference executor: called with the N tensors `first`, then replayed with `second`.
template <std::size_t N, class F>
void check_compiled(F&& program, const std::string& mode, bool dynamic, const std::vector<Tensor>& first,
                    const std::vector<Tensor>& second) {
  REQUIRE(first.size() == N);
  REQUIRE(second.size() == N);
  auto apply = [&]<std::size_t... I>(auto& fn, const std::vector<Tensor>& a, std::index_sequence<I...>) {
    return fn(a[I]...);
  };
  CompileOptions options;
  options.mode = mode;
  if (dynamic) options.dynamic = true;
  auto f = kiln::compile([&](const auto&... ts) { return program(ts...); }, options);  // a std::vector<Tensor>
  for (const auto* args : {&first, &second}) {
    auto eager = [&] { return apply(program, *args, std::make_index_sequence<N>{}); };
    Result ref = evaluate_with(eager, Backend::Eager);
    auto compiled = [&] { return apply(f, *args, std::make_index_sequence<N>{}); };
    Result got = evaluate_with(compiled, Backend::Auto);
    CAPTURE(args == &first ? "first call" : "replay");
    check_same(ref, got);
  }
}

/// Checks that the default backend agrees with the reference executor on program(), a callable
/// returning std::vector<Tensor>: same dtypes and shapes, NaN where NaN, the same infinities,
/// finite values within torch.testing's default tolerance of their dtype.
template <class F>
void check_against_reference(F&& program) {
  check_same(evaluate_with(program, Backend::Eager), evaluate_with(program, Backend::Auto));
}

}  // namespace kiln::fuzz
