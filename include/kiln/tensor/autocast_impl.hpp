#pragma once
// The definitions of autocast (tensor/autocast.hpp). Header-only mode includes them from that
// header (KILN_ENTRY is `inline`); compiled mode compiles them once into kiln::kiln_compiled
// (src/kiln_compiled.cpp), so users' translation units parse the declarations only.
#include "kiln/tensor/autocast.hpp"

namespace kiln {
namespace detail {

KILN_ENTRY bool autocast_on(Device device) {
  const std::size_t k = autocast_kind(device.kind);
  return k < kAutocastKinds && autocast_tls.enabled[k];
}

KILN_ENTRY DType autocast_target(AutocastClass c, DType t, Device device) {
  if (c == AutocastClass::Fp32) return is_reduced_float(t) && autocast_on(device) ? DType::Float32 : t;
  if (c == AutocastClass::LowerPrecision && autocast_eligible(t) && autocast_on(device))
    return autocast_tls.dtype[autocast_kind(device.kind)];
  return t;
}

KILN_ENTRY Tensor autocast_cast(const Tensor& t, AutocastClass c) {
  if (!t.defined()) return t;
  const DType to = autocast_target(c, t.dtype(), t.device());
  return to == t.dtype() ? t : Tensor(ir::cast(t.node(), to));
}

KILN_ENTRY void autocast_promote(std::initializer_list<Tensor*> ts) {
  bool any = false;
  DType to = DType::Bool;
  for (Tensor* t : ts) {
    if (!t->defined() || !autocast_eligible(t->dtype()) || !autocast_on(t->device())) continue;
    if (!any) to = autocast_tls.dtype[autocast_kind(t->device().kind)];
    any = true;
    to = promote_types(to, t->dtype());
  }
  if (!any) return;
  for (Tensor* t : ts)
    if (t->defined() && autocast_eligible(t->dtype()) && autocast_on(t->device()) && t->dtype() != to)
      *t = Tensor(ir::cast(t->node(), to));
}

KILN_ENTRY std::uint32_t autocast_key() {
  std::uint32_t key = 0;
  for (std::size_t k = 0; k < kAutocastKinds; ++k)
    if (autocast_tls.enabled[k]) key |= (1u | (static_cast<std::uint32_t>(autocast_tls.dtype[k]) << 1)) << (8 * k);
  return key;
}

KILN_ENTRY std::string autocast_describe() {
  if (autocast_key() == 0) return "off";
  std::string s;
  const char* names[kAutocastKinds] = {"cpu", "cuda"};
  for (std::size_t k = 0; k < kAutocastKinds; ++k) {
    if (k) s += ", ";
    s += std::string(names[k]) + ": " + (autocast_tls.enabled[k] ? dtype_name(autocast_tls.dtype[k]) : "off");
  }
  return s;
}

}  // namespace detail
}  // namespace kiln

namespace kiln {

KILN_ENTRY DType get_autocast_dtype(Device::Kind device_type) {
  const std::size_t k = detail::autocast_kind(device_type);
  return k < detail::kAutocastKinds ? detail::autocast_tls.dtype[k] : DType::BFloat16;
}

}  // namespace kiln
