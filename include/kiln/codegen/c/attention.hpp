#pragma once
// The unit of a fused attention step (sched::AttentionCall), shared by the C++ and CUDA
// generators: its entries run in order over one argument list.
//
// Arguments (one list for every entry, null where the call has no such slot):
//   forward:  {q, k, v, mask, out, lse, seed}
//   backward: {q, k, v, mask, out, dout, lse, dq, dk, dv, delta, seed}
// seed: dropout's 0-dim int64 Philox key (KA_SEED_ARG says where).
// lse and delta are of the call's accumulation_dtype() (float32, float64 for float64 operands).
// On the CPU an entry is `extern "C" int entry(void* const* args, int nth)`; on the GPU a
// kernel taking one struct of those pointers by value (`struct { void* p[N]; }`), launched as
// `grid` blocks (a 1-D grid: the kernel decodes its tile, head and batch from blockIdx.x) of
// `block` threads with `shared_bytes` of dynamic shared memory.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/codegen/c/literals.hpp"
#include "kiln/core/philox.hpp"
#include "kiln/sched/steps.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::codegen {

struct AttentionSource {
  struct Entry {
    std::string name;
    std::int64_t grid = 0, block = 0, shared_bytes = 0;  ///< GPU launch (grid 0: nothing to run)
  };
  std::string source;
  std::vector<Entry> entries;  ///< run in this order
  int arguments = 0;           ///< 7 (forward) or 12 (backward)
};

namespace attention_detail {

/// The C text both dialects' units start from: the call's sizes, flags, scale and every slot's
/// element strides as macros (KA_B ... KA_DV3; an absent slot's strides are 0) and the types
/// (ka_acc: the arithmetic, ka_stat: lse and delta, ka_t: the operands, ka_mask_t).
inline std::string attention_constants(const sched::AttentionCall& c) {
  std::string s;
  auto def = [&](const std::string& k, const std::string& v) { s += "#define " + k + " " + v + "\n"; };
  auto ll = [](std::int64_t v) { return std::to_string(v) + "LL"; };
  def("KA_B", ll(c.batch));
  def("KA_H", ll(c.heads));
  def("KA_HKV", ll(c.kv_heads));
  def("KA_GROUP", ll(c.group()));
  def("KA_L", ll(c.q_len));
  def("KA_S", ll(c.kv_len));
  def("KA_E", std::to_string(c.head_dim));
  def("KA_EV", std::to_string(c.value_dim));
  def("KA_CAUSAL", c.causal ? "1" : "0");
  def("KA_HAS_MASK", c.has_mask ? "1" : "0");
  // 1 / sqrt(0) for empty feature dims is inf (every score NaN, as torch's): spelled as a
  // constant division, which both dialects read.
  def("KA_SCALE", std::isfinite(c.scale) ? "(" + c_family::hex_double(c.scale) + ")"
                  : std::isnan(c.scale)  ? std::string("(0.0 / 0.0)")
                                         : std::string(c.scale > 0 ? "(1.0 / 0.0)" : "(-1.0 / 0.0)"));
  def("KA_WANT_OUT", c.wants(c.out) ? "1" : "0");
  def("KA_WANT_LSE", c.wants(c.lse) ? "1" : "0");
  def("KA_WANT_DK", c.wants(c.dk) ? "1" : "0");
  def("KA_WANT_DV", c.wants(c.dv) ? "1" : "0");
  // Dropout: P's element is kept where its uniform draw is >= KA_KEEP_FROM (the float
  // comparison a written-out dropout makes) and scaled by KA_KEEP_SCALE.
  def("KA_DROPOUT", c.has_dropout() ? "1" : "0");
  def("KA_SEED_ARG", c.kind == sched::AttentionCall::Forward ? "6" : "11");
  def("KA_KEEP_FROM", "(" + c_family::hex_double(static_cast<float>(c.dropout_p)) + "f)");
  def("KA_KEEP_SCALE", "(" + c_family::hex_double(c.has_dropout() ? 1.0 / (1.0 - c.dropout_p) : 1.0) + ")");
  const bool dbl = c.dtype == DType::Float64;
  def("KA_EXP", dbl ? "exp" : "expf");
  def("KA_LOG", dbl ? "log" : "logf");
  const std::pair<const char*, const sched::Slot*> slots[] = {{"KA_Q", &c.q},   {"KA_K", &c.k},   {"KA_V", &c.v},
                                                              {"KA_M", &c.mask}, {"KA_O", &c.out}, {"KA_G", &c.dout},
                                                              {"KA_DQ", &c.dq}, {"KA_DK", &c.dk}, {"KA_DV", &c.dv}};
  for (const auto& [prefix, slot] : slots)
    for (std::size_t d = 0; d < 4; ++d) {
      const bool absent = slot->kind == sched::Slot::None || slot->strides.size() != 4;
      def(prefix + std::to_string(d), ll(absent ? 0 : slot->strides[d]));
    }
  s += std::string("typedef ") + (dbl ? "double" : "float") + " ka_acc;\n";
  s += std::string("typedef ") + (c.accumulation_dtype() == DType::Float64 ? "double" : "float") + " ka_stat;\n";
  s += "typedef " + std::string(c_family::stype(c.dtype)) + " ka_t;\n";
  s += "typedef " + std::string(c_family::stype(c.has_mask ? c.mask_dtype : c.dtype)) + " ka_mask_t;\n";
  return s;
}

/// The conversions ka_ld (operand to ka_acc), ka_st (back) and ka_ldm (mask to ka_acc), each
/// declared with `qualifier`; they call the 16-bit helpers `needs` asks the prelude for.
inline std::string attention_conversions(const sched::AttentionCall& c, const std::string& qualifier,
                                         c_family::PreludeNeeds& needs) {
  const DType mdt = c.has_mask ? c.mask_dtype : c.dtype;
  // A maximum that keeps a NaN (a NaN score makes its row NaN, as softmax's, not masked).
  return qualifier + " ka_acc ka_nanmax(ka_acc a, ka_acc b) { return (a != a || a > b) ? a : b; }\n" + qualifier +
         " ka_acc ka_ld(ka_t x) { return (ka_acc)" + c_family::from_storage("x", c.dtype, needs) + "; }\n" +
         qualifier + " ka_t ka_st(ka_acc v) { return " +
         c_family::to_storage("(" + std::string(c_family::ctype(c.dtype)) + ")v", c.dtype, needs) + "; }\n" +
         qualifier + " ka_acc ka_ldm(ka_mask_t x) { return (ka_acc)" + c_family::from_storage("x", mdt, needs) +
         "; }\n";
}

/// Dropout's helpers, declared with `qualifier` after Philox's source (empty without dropout):
/// `ka_drop_index(b, h, i, j)`, the flat index of P's element in a [B, H, L, S] tensor, whose
/// uniform is kiln::philox::uniform_f32 of that index; `ka_kept(u)`, the factor a uniform gives
/// (0, or KA_KEEP_SCALE where kept); `ka_keep_of(word)`, the same for a block's word (kernels
/// that share a block among four neighbours); `ka_keep(seed, b, h, i, j)`, one element's.
inline std::string attention_dropout(const sched::AttentionCall& c, const std::string& qualifier) {
  if (!c.has_dropout()) return {};
  return std::string(philox::kPhiloxSource) + "\n" + qualifier +
         " unsigned long long ka_drop_index(long long b, long long h, long long i, long long j) {\n"
         "  return (unsigned long long)(((b * KA_H + h) * KA_L + i) * KA_S + j);\n}\n" +
         qualifier + " ka_acc ka_kept(float u) { return u >= KA_KEEP_FROM ? (ka_acc)KA_KEEP_SCALE : (ka_acc)0; }\n" +
         qualifier + " ka_acc ka_keep_of(unsigned int word) { return ka_kept(kiln::philox::uniform_f32_of(word)); }\n" +
         qualifier +
         " ka_acc ka_keep(unsigned long long seed, long long b, long long h, long long i, long long j) {\n"
         "  return ka_kept(kiln::philox::uniform_f32(seed, ka_drop_index(b, h, i, j)));\n}\n";
}

}  // namespace attention_detail

}  // namespace kiln::codegen

KILN_COLD_CODE_END
