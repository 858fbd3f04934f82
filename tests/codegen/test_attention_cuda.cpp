// The CUDA attention kernels (codegen/cuda/attention.hpp) without a GPU: each unit runs in the
// host emulator of CUDA (tests/codegen/cuda_emulator.hpp, whose mma.sync follows the PTX ISA's
// fragment layout lane by lane) against a float64 reference written here, over the tensor-core
// path (f16, bf16) and the generic one (f32, f64, odd head dims), contiguous and strided layouts,
// causal and additive masks, grouped-query heads, fully masked rows, empty lengths and partial
// result sets; and NVRTC compiles every unit for sm_90 and sm_80.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <random>

#include "cuda_emulator.hpp"
#include "kiln/codegen/cuda/attention.hpp"
#include "kiln/runtime/nvrtc.hpp"

namespace kiln_test_codegen_attention_cuda {

namespace {

using namespace kiln;
using i64 = std::int64_t;
constexpr double kInf = std::numeric_limits<double>::infinity();

/// A 4-d tensor in host memory at arbitrary element strides.
struct Buf {
  DType dt = DType::Float32;
  std::vector<i64> shape, strides;
  std::vector<unsigned char> bytes;

  i64 off(i64 a, i64 b, i64 c, i64 d) const { return a * strides[0] + b * strides[1] + c * strides[2] + d * strides[3]; }
  double get(i64 a, i64 b, i64 c, i64 d) const { return load(off(a, b, c, d)); }
  double load(i64 o) const {
    const unsigned char* p = bytes.data() + o * static_cast<i64>(itemsize(dt));
    switch (dt) {
      case DType::Float16: {
        std::uint16_t x;
        std::memcpy(&x, p, 2);
        return static_cast<float>(Half::from_bits(x));
      }
      case DType::BFloat16: {
        std::uint16_t x;
        std::memcpy(&x, p, 2);
        return static_cast<float>(BFloat16::from_bits(x));
      }
      case DType::Float32: {
        float x;
        std::memcpy(&x, p, 4);
        return x;
      }
      default: {
        double x;
        std::memcpy(&x, p, 8);
        return x;
      }
    }
  }
  /// Stores `v` rounded to the dtype; returns the stored value.
  double set(i64 a, i64 b, i64 c, i64 d, double v) {
    unsigned char* p = bytes.data() + off(a, b, c, d) * static_cast<i64>(itemsize(dt));
    switch (dt) {
      case DType::Float16: {
        const std::uint16_t x = Half(static_cast<float>(v)).bits;
        std::memcpy(p, &x, 2);
        break;
      }
      case DType::BFloat16: {
        const std::uint16_t x = BFloat16(static_cast<float>(v)).bits;
        std::memcpy(p, &x, 2);
        break;
      }
      case DType::Float32: {
        const float x = static_cast<float>(v);
        std::memcpy(p, &x, 4);
        break;
      }
      default:
        std::memcpy(p, &v, 8);
    }
    return get(a, b, c, d);
  }
  void* data() { return bytes.data(); }
};

/// A buffer of `shape` at `strides`, every byte 0xCD (what an unwritten element reads as).
Buf make_buf(DType dt, std::vector<i64> shape, std::vector<i64> strides) {
  Buf b;
  b.dt = dt;
  b.shape = std::move(shape);
  b.strides = std::move(strides);
  i64 last = 0;
  for (std::size_t d = 0; d < 4; ++d)
    if (b.shape[d] > 0) last += (b.shape[d] - 1) * b.strides[d];
  b.bytes.assign(static_cast<std::size_t>((last + 1) * static_cast<i64>(itemsize(dt))) + 16, 0xCD);
  return b;
}

/// Strides of a [n0, n1, n2, n3] tensor: contiguous (layout 0), or stored as [n0, n2, n1, n3 + pad]
/// (rows of heads interleaved, each row padded), pad 8 keeping 16-byte rows (layout 1) or 3
/// breaking them (layout 2).
std::vector<i64> layout_strides(const std::vector<i64>& s, int layout) {
  if (layout == 0) return {s[1] * s[2] * s[3], s[2] * s[3], s[3], 1};
  const i64 row = s[3] + (layout == 1 ? 8 : 3);
  return {s[2] * s[1] * row, row, s[1] * row, 1};
}

/// Whether every byte of `b` outside its elements is still 0xCD (no write strayed into gaps).
bool gaps_untouched(const Buf& b) {
  std::vector<char> used(b.bytes.size(), 0);
  const i64 is = static_cast<i64>(itemsize(b.dt));
  for (i64 x0 = 0; x0 < b.shape[0]; ++x0)
    for (i64 x1 = 0; x1 < b.shape[1]; ++x1)
      for (i64 x2 = 0; x2 < b.shape[2]; ++x2)
        for (i64 x3 = 0; x3 < b.shape[3]; ++x3)
          for (i64 y = 0; y < is; ++y) used[static_cast<std::size_t>(b.off(x0, x1, x2, x3) * is + y)] = 1;
  for (std::size_t i = 0; i < b.bytes.size(); ++i)
    if (!used[i] && b.bytes[i] != 0xCD) return false;
  return true;
}

struct Case {
  std::string what;
  DType dtype;
  i64 B, H, Hkv, L, S, E, Ev;
  bool causal = false;
  int mask = 0;  ///< 0 none, 1 broadcast over batch, 2 broadcast over heads
  DType mask_dtype = DType::Float32;
  int layout = 0;  ///< of q, k, v, out, dout, dq, dk, dv (layout_strides)
  bool masked_rows = false;  ///< the mask makes some rows' keys all -inf
  bool want_out = true, want_dq = true, want_dk = true;  ///< lse, dv always wanted
  double dropout = 0.0;  ///< P's dropout probability (the key is fixed per case)
};

double tolerance(DType t) {
  switch (t) {
    case DType::Float16:
      return 5e-3;
    case DType::BFloat16:
      return 2e-2;
    case DType::Float32:
      return 1e-4;
    default:
      return 1e-10;  // float64 throughout (lse and delta too)
  }
}

/// The emulator build of a unit: launch(name, grid, block, shared, args).
struct Unit {
  std::shared_ptr<runtime::SharedLibrary> lib;
  void (*launch)(const char*, unsigned, unsigned, unsigned, void**) = nullptr;
};

Unit build(const codegen::AttentionSource& src) {
  std::string unit = kiln_cuda_emu::kPrelude;
  unit += src.source;
  unit += "\nstruct ka_emu_call { void (*fn)(ka_args); ka_args a; };\n"
          "static void ka_emu_body(void* p) { ka_emu_call* c = (ka_emu_call*)p; c->fn(c->a); }\n"
          "extern \"C\" void ka_emu_launch(const char* name, unsigned grid, unsigned block, unsigned smem, void** args) {\n"
          "  ka_emu_call c; c.fn = nullptr; memcpy(c.a.p, args, sizeof c.a.p);\n";
  for (auto& e : src.entries) unit += "  if (!strcmp(name, \"" + e.name + "\")) c.fn = " + e.name + ";\n";
  unit += "  if (!c.fn) ::kiln_emu::no_kernel(name);\n"
          "  ::kiln_emu::run_grid(grid, block, smem, ka_emu_body, &c);\n}\n";
  Unit u;
  u.lib = kiln_cuda_emu::load_library(unit);
  u.launch = reinterpret_cast<decltype(u.launch)>(u.lib->symbol("ka_emu_launch"));
  return u;
}

void run(const codegen::AttentionSource& src, std::vector<void*> args) {
  REQUIRE(static_cast<int>(args.size()) == src.arguments);
  Unit u = build(src);
  for (auto& e : src.entries) {
    if (e.grid == 0) continue;
    CHECK((e.block == 128 || e.block == 256));
    u.launch(e.name.c_str(), static_cast<unsigned>(e.grid), static_cast<unsigned>(e.block),
             static_cast<unsigned>(e.shared_bytes), args.data());
  }
}

/// "" when NVRTC compiles `src` for sm_90 and sm_80 (or is absent), else what failed.
std::string nvrtc_check(const std::string& source) {
  if (!runtime::nvrtc_available()) return "";
  for (const char* arch : {"sm_90", "sm_80"}) {
    try {
      const std::string cubin = runtime::compile_cuda_to_cubin(source, "attention.cu", arch);
      if (cubin.compare(0, 4, "\x7f" "ELF") != 0) return std::string(arch) + ": not a cubin";
    } catch (const std::exception& e) {
      return std::string(arch) + ": " + e.what();
    }
  }
  return "";
}

/// max |got - want| over the elements, relative to max |want| (at least 1e-3); -inf must match
/// exactly (lse of fully masked rows).
struct Diff {
  double err = 0, scale = 1e-3;
  bool inf_mismatch = false;
  void add(double got, double want) {
    if (std::isinf(want) || std::isinf(got) || std::isnan(got)) {
      if (!(got == want)) inf_mismatch = true;
      return;
    }
    err = std::max(err, std::fabs(got - want));
    scale = std::max(scale, std::fabs(want));
  }
  double rel() const { return err / scale; }
};

void check_case(const Case& cs, std::uint64_t seed, bool tensor_cores) {
  CAPTURE(cs.what);
  const DType dt = cs.dtype;
  const i64 B = cs.B, H = cs.H, Hkv = cs.Hkv, L = cs.L, S = cs.S, E = cs.E, Ev = cs.Ev, G = H / Hkv;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uni(-1.0, 1.0);
  Buf q = make_buf(dt, {B, H, L, E}, layout_strides({B, H, L, E}, cs.layout));
  Buf k = make_buf(dt, {B, Hkv, S, E}, layout_strides({B, Hkv, S, E}, cs.layout));
  Buf v = make_buf(dt, {B, Hkv, S, Ev}, layout_strides({B, Hkv, S, Ev}, cs.layout));
  Buf dout = make_buf(dt, {B, H, L, Ev}, layout_strides({B, H, L, Ev}, cs.layout));
  auto fill = [&](Buf& b, double amp) {
    for (i64 x0 = 0; x0 < b.shape[0]; ++x0)
      for (i64 x1 = 0; x1 < b.shape[1]; ++x1)
        for (i64 x2 = 0; x2 < b.shape[2]; ++x2)
          for (i64 x3 = 0; x3 < b.shape[3]; ++x3) b.set(x0, x1, x2, x3, amp * uni(rng));
  };
  // Scores of a few units: a peaked softmax, not a flat average.
  fill(q, 2.0), fill(k, 1.0), fill(v, 1.0), fill(dout, 1.0);
  Buf mask;
  if (cs.mask) {
    std::vector<i64> ms = cs.mask == 1 ? std::vector<i64>{0, L * S, S, 1} : std::vector<i64>{H * L * S, 0, S, 1};
    mask = make_buf(cs.mask_dtype, {cs.mask == 1 ? 1 : B, cs.mask == 2 ? 1 : H, L, S}, ms);
    fill(mask, 1.0);
    for (i64 x0 = 0; x0 < mask.shape[0]; ++x0)
      for (i64 x1 = 0; x1 < mask.shape[1]; ++x1)
        for (i64 i = 0; i < L; ++i)
          for (i64 j = 0; j < S; ++j) {
            if ((i * 7 + j * 3 + x1) % 11 == 0) mask.set(x0, x1, i, j, -kInf);  // scattered masked keys
            if (cs.masked_rows && (i % 5 == 2)) mask.set(x0, x1, i, j, -kInf);
          }
    mask.shape = {B, H, L, S};  // read through the broadcast strides
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(E));
  // Dropout's factor per score, from Philox as ir::Op::Attention defines it: the counter is the
  // flat index of a [B, H, L, S] tensor.
  unsigned long long key = 0x5eed0000ull + seed;
  std::vector<double> Z(B * H * L * S, 1.0);
  if (cs.dropout > 0)
    for (std::size_t n = 0; n < Z.size(); ++n)
      Z[n] = philox::uniform_f32(key, n) >= static_cast<float>(cs.dropout) ? 1.0 / (1.0 - cs.dropout) : 0.0;

  // The float64 reference: forward, then the backward from the rounded output.
  std::vector<double> ref_out(B * H * L * Ev, 0.0), ref_lse(B * H * L), P(B * H * L * S, 0.0);
  for (i64 b = 0; b < B; ++b)
    for (i64 h = 0; h < H; ++h)
      for (i64 i = 0; i < L; ++i) {
        const i64 row = (b * H + h) * L + i;
        std::vector<double> s(S, -kInf);
        double mx = -kInf;
        for (i64 j = 0; j < S; ++j) {
          if (cs.causal && j > i) continue;
          double d = 0;
          for (i64 e = 0; e < E; ++e) d += q.get(b, h, i, e) * k.get(b, h / G, j, e);
          s[j] = d * scale + (cs.mask ? mask.get(b, h, i, j) : 0.0);
          mx = std::max(mx, s[j]);
        }
        if (mx == -kInf) {
          ref_lse[row] = -kInf;
          continue;
        }
        double l = 0;
        for (i64 j = 0; j < S; ++j) l += std::exp(s[j] - mx);
        ref_lse[row] = mx + std::log(l);
        for (i64 j = 0; j < S; ++j) P[row * S + j] = std::exp(s[j] - ref_lse[row]);
        for (i64 e = 0; e < Ev; ++e) {
          double o = 0;
          for (i64 j = 0; j < S; ++j) o += P[row * S + j] * Z[row * S + j] * v.get(b, h / G, j, e);
          ref_out[row * Ev + e] = o;
        }
      }

  auto slot = [](const Buf& b) {
    sched::Slot s;
    s.kind = sched::Slot::Leaf;
    s.strides = b.strides;
    return s;
  };
  sched::AttentionCall c;
  c.dtype = dt;
  c.batch = B, c.heads = H, c.kv_heads = Hkv, c.q_len = L, c.kv_len = S, c.head_dim = E, c.value_dim = Ev;
  c.causal = cs.causal;
  c.scale = scale;
  c.has_mask = cs.mask != 0;
  c.mask_dtype = cs.mask_dtype;
  c.q = slot(q), c.k = slot(k), c.v = slot(v);
  if (cs.mask) c.mask = slot(mask);
  c.dropout_p = cs.dropout;
  if (cs.dropout > 0) c.seed = sched::Slot{sched::Slot::Leaf, 0, {}};
  void* const key_arg = cs.dropout > 0 ? &key : nullptr;
  const bool tc = c.tensor_cores();
  CHECK(tc == tensor_cores);  // the path the case is meant for

  // Forward.
  Buf out = make_buf(dt, {B, H, L, Ev}, layout_strides({B, H, L, Ev}, cs.layout));
  Buf lse = make_buf(c.accumulation_dtype(), {B, H, L, 1}, {H * L, L, 1, 1});
  c.kind = sched::AttentionCall::Forward;
  if (cs.want_out) c.out = slot(out);
  c.lse = slot(lse);
  codegen::AttentionSource fsrc = codegen::generate_cuda_attention(c, "katt");
  CHECK(fsrc.arguments == 7);
  auto fnv = std::async(std::launch::async, nvrtc_check, fsrc.source);
  run(fsrc, {q.data(), k.data(), v.data(), cs.mask ? mask.data() : nullptr, cs.want_out ? out.data() : nullptr,
             lse.data(), key_arg});
  const double tol = tolerance(dt);
  {
    Diff dl, dout_diff;
    bool exact = true;
    for (i64 b = 0; b < B; ++b)
      for (i64 h = 0; h < H; ++h)
        for (i64 i = 0; i < L; ++i) {
          const i64 row = (b * H + h) * L + i;
          dl.add(lse.get(b, h, i, 0), ref_lse[row]);
          if (!cs.want_out) continue;
          for (i64 e = 0; e < Ev; ++e) {
            dout_diff.add(out.get(b, h, i, e), ref_out[row * Ev + e]);
            if (ref_lse[row] == -kInf && out.get(b, h, i, e) != 0.0) exact = false;
          }
        }
    CHECK_MESSAGE(!dl.inf_mismatch, "lse: -inf where the reference is finite or the other way round");
    CHECK_MESSAGE(dl.rel() <= tol, "lse error " << dl.rel());
    if (cs.want_out) {
      CHECK_MESSAGE(!dout_diff.inf_mismatch, "out: non-finite values");
      CHECK_MESSAGE(dout_diff.rel() <= tol, "out error " << dout_diff.rel());
      CHECK_MESSAGE(exact, "a fully masked row's output is not 0");
      CHECK(gaps_untouched(out));
    } else {
      CHECK(gaps_untouched(out));
      for (unsigned char x : out.bytes) CHECK_MESSAGE(x == 0xCD, "out written though not wanted");
    }
  }

  // Backward, from the reference's output rounded to the dtype and its lse in the accumulation dtype.
  Buf ob = make_buf(dt, {B, H, L, Ev}, layout_strides({B, H, L, Ev}, cs.layout));
  Buf lb = make_buf(c.accumulation_dtype(), {B, H, L, 1}, {H * L, L, 1, 1});
  for (i64 b = 0; b < B; ++b)
    for (i64 h = 0; h < H; ++h)
      for (i64 i = 0; i < L; ++i) {
        const i64 row = (b * H + h) * L + i;
        lb.set(b, h, i, 0, ref_lse[row]);
        for (i64 e = 0; e < Ev; ++e) ob.set(b, h, i, e, ref_out[row * Ev + e]);
      }
  std::vector<double> rdq(B * H * L * E, 0.0), rdk(B * Hkv * S * E, 0.0), rdv(B * Hkv * S * Ev, 0.0);
  for (i64 b = 0; b < B; ++b)
    for (i64 h = 0; h < H; ++h)
      for (i64 i = 0; i < L; ++i) {
        const i64 row = (b * H + h) * L + i, hk = h / G;
        double delta = 0;
        for (i64 e = 0; e < Ev; ++e) delta += dout.get(b, h, i, e) * ob.get(b, h, i, e);
        for (i64 j = 0; j < S; ++j) {
          const double p = P[row * S + j];
          if (p == 0) continue;
          double dp = 0;
          for (i64 e = 0; e < Ev; ++e) dp += dout.get(b, h, i, e) * v.get(b, hk, j, e);
          const double z = Z[row * S + j], ds = p * (z * dp - delta);
          for (i64 e = 0; e < E; ++e) {
            rdq[row * E + e] += scale * ds * k.get(b, hk, j, e);
            rdk[((b * Hkv + hk) * S + j) * E + e] += scale * ds * q.get(b, h, i, e);
          }
          for (i64 e = 0; e < Ev; ++e) rdv[((b * Hkv + hk) * S + j) * Ev + e] += p * z * dout.get(b, h, i, e);
        }
      }
  Buf dq = make_buf(dt, {B, H, L, E}, layout_strides({B, H, L, E}, cs.layout));
  Buf dk = make_buf(dt, {B, Hkv, S, E}, layout_strides({B, Hkv, S, E}, cs.layout));
  Buf dv = make_buf(dt, {B, Hkv, S, Ev}, layout_strides({B, Hkv, S, Ev}, cs.layout));
  Buf delta = make_buf(c.accumulation_dtype(), {B, H, L, 1}, {H * L, L, 1, 1});
  c.kind = sched::AttentionCall::Backward;
  c.out = slot(ob), c.dout = slot(dout), c.lse = slot(lb);
  c.dq = cs.want_dq ? slot(dq) : sched::Slot{};
  c.dk = cs.want_dk ? slot(dk) : sched::Slot{};
  c.dv = slot(dv);
  codegen::AttentionSource bsrc = codegen::generate_cuda_attention(c, "katt");
  CHECK(bsrc.arguments == 12);
  auto bnv = std::async(std::launch::async, nvrtc_check, bsrc.source);
  run(bsrc, {q.data(), k.data(), v.data(), cs.mask ? mask.data() : nullptr, ob.data(), dout.data(), lb.data(),
             cs.want_dq ? dq.data() : nullptr, cs.want_dk ? dk.data() : nullptr, dv.data(), delta.data(), key_arg});
  auto compare = [&](const std::string& name, const Buf& got, const std::vector<double>& want, i64 heads, i64 rows,
                     i64 width, bool wanted) {
    CAPTURE(name);
    CHECK(gaps_untouched(got));
    if (!wanted) {
      for (unsigned char x : got.bytes) CHECK_MESSAGE(x == 0xCD, name << " written though not wanted");
      return;
    }
    Diff d;
    bool zero_rows = true;
    for (i64 b = 0; b < B; ++b)
      for (i64 h = 0; h < heads; ++h)
        for (i64 r = 0; r < rows; ++r) {
          // dq of a fully masked query row is exactly 0
          const bool masked = name == "dq" && ref_lse[(b * H + h) * L + r] == -kInf;
          for (i64 e = 0; e < width; ++e) {
            const double g = got.get(b, h, r, e);
            d.add(g, want[((b * heads + h) * rows + r) * width + e]);
            if (masked && g != 0.0) {
              if (zero_rows) MESSAGE(name << " at (" << b << ", " << h << ", " << r << ", " << e << "): " << g);
              zero_rows = false;
            }
          }
        }
    CHECK_MESSAGE(!d.inf_mismatch, name << ": non-finite values");
    CHECK_MESSAGE(d.rel() <= tol, name << " error " << d.rel() << " (max |want| " << d.scale << ")");
    CHECK_MESSAGE(zero_rows, name << ": a fully masked row's gradient is not 0");
  };
  compare("dq", dq, rdq, H, L, E, cs.want_dq);
  compare("dk", dk, rdk, Hkv, S, E, cs.want_dk);
  compare("dv", dv, rdv, Hkv, S, Ev, true);

  const std::string fm = fnv.get(), bm = bnv.get();
  CHECK_MESSAGE(fm.empty(), "NVRTC, forward: " << fm);
  CHECK_MESSAGE(bm.empty(), "NVRTC, backward: " << bm);
}

/// A call of `dt` over sizes {B, H, Hkv, L, S, E, Ev} whose every slot is a leaf at `strides`.
sched::AttentionCall uniform_call(DType dt, const std::array<i64, 7>& n, std::vector<i64> strides) {
  sched::AttentionCall c;
  c.dtype = dt;
  c.batch = n[0], c.heads = n[1], c.kv_heads = n[2], c.q_len = n[3], c.kv_len = n[4], c.head_dim = n[5],
  c.value_dim = n[6];
  sched::Slot s;
  s.kind = sched::Slot::Leaf;
  s.strides = std::move(strides);
  c.q = c.k = c.v = c.out = c.dout = c.dq = c.dk = c.dv = c.lse = s;
  return c;
}

bool have_host_compiler() {
  if (runtime::CpuModuleCache::instance().compiler()) return true;
  MESSAGE("no host C++ compiler, emulated CUDA attention tests skipped");
  return false;
}

}  // namespace

TEST_CASE("cuda attention: tensor-core kernels (f16, bf16) match a float64 reference in the emulator") {
  if (!have_host_compiler()) return;
  const DType f16 = DType::Float16, bf16 = DType::BFloat16, f32 = DType::Float32;
  std::vector<Case> cases = {
      {"f16 E=64, L=S=129 (partial tiles), plain", f16, 1, 2, 2, 129, 129, 64, 64},
      {"bf16 E=128, GQA 4/2, causal, L=7 S=129, strided rows", bf16, 1, 4, 2, 7, 129, 128, 128, true, 0, f32, 1},
      {"f16 E=32, f32 mask over batch with fully masked rows, L=129 S=7, unaligned rows", f16, 2, 1, 1, 129, 7, 32,
       32, false, 1, f32, 2, true},
      {"bf16 E=96, causal, bf16 mask over heads, L=1 S=129", bf16, 2, 2, 1, 1, 129, 96, 96, true, 2, bf16},
      {"f16 E=64 Ev=128, causal, L=129 S=7, GQA 2/1", f16, 1, 2, 1, 129, 7, 64, 128, true, 0, f32, 1},
      {"f16 E=Ev=256 (dK and dV apart), f16 mask", f16, 1, 1, 1, 7, 7, 256, 256, false, 1, f16},
      {"bf16 E=32, causal, L=S=129 (key tiles past the diagonal skipped), GQA 2/1, strided", bf16, 1, 2, 1, 129, 129,
       32, 32, true, 0, f32, 1},
  };
  Case lse_only{"f16 E=64, lse only; dv only", f16, 1, 1, 1, 7, 7, 64, 64};
  lse_only.want_out = false, lse_only.want_dq = false, lse_only.want_dk = false;
  cases.push_back(lse_only);
  cases.push_back({"f16 E=64, S=0: out 0, lse -inf, dq 0", f16, 1, 2, 2, 7, 0, 64, 64});
  // S a multiple of 4: lanes share Philox blocks (trading words by shuffles); S = 9: a draw per score.
  Case dropout{"f16 E=64, dropout 0.3, causal, GQA 2/1, L=70 S=72", f16, 1, 2, 1, 70, 72, 64, 64, true};
  dropout.dropout = 0.3;
  cases.push_back(dropout);
  Case wide_dropout{"bf16 E=Ev=256 (dK and dV apart), dropout 0.5, f32 mask", bf16, 1, 1, 1, 7, 9, 256, 256, false, 1};
  wide_dropout.dropout = 0.5;
  cases.push_back(wide_dropout);
  for (std::size_t i = 0; i < cases.size(); ++i) check_case(cases[i], 1000 + i, true);
}

TEST_CASE("cuda attention: generic kernels (f32, f64, odd head dims) match a float64 reference in the emulator") {
  if (!have_host_compiler()) return;
  const DType f16 = DType::Float16, f32 = DType::Float32, f64 = DType::Float64;
  std::vector<Case> cases = {
      {"f32 E=40, GQA 4/2, causal, f64 mask over batch, L=129 S=7", f32, 1, 4, 2, 129, 7, 40, 40, true, 1, f64},
      {"f32 E=24 Ev=40, f16 mask over heads, fully masked rows, L=7 S=129, unaligned strided", f32, 2, 1, 1, 7, 129,
       24, 40, false, 2, f16, 2, true},
      {"f64 E=32, causal, L=S=33, strided", f64, 1, 2, 2, 33, 33, 32, 32, true, 1, f64, 1},
      {"f16 E=24 (generic), L=7 S=129", f16, 1, 1, 1, 7, 129, 24, 24, false, 1, f32},
      {"f32 E=40, L=0: dk and dv are 0", f32, 1, 2, 1, 0, 7, 40, 40},
  };
  Case partial{"f32 E=40, lse only; dv only, causal", f32, 1, 1, 1, 7, 9, 40, 40, true};
  partial.want_out = false, partial.want_dq = false, partial.want_dk = false;
  cases.push_back(partial);
  Case dropout{"f64 E=32, dropout 0.5, f64 mask over batch, GQA 2/1, L=33 S=20", f64, 1, 2, 1, 33, 20, 32, 32, false,
               1, f64};
  dropout.dropout = 0.5;
  cases.push_back(dropout);
  for (std::size_t i = 0; i < cases.size(); ++i) check_case(cases[i], 2000 + i, false);
}

TEST_CASE("cuda attention: entries, grids and shared memory per shape") {
  sched::AttentionCall c =
      uniform_call(DType::Float16, {2, 8, 2, 1000, 1000, 128, 128}, {8 * 1000 * 128, 1000 * 128, 128, 1});
  c.kind = sched::AttentionCall::Forward;
  codegen::AttentionSource f = codegen::generate_cuda_attention(c, "a");
  REQUIRE(f.entries.size() == 1);
  CHECK(f.entries[0].name == "a_forward");
  CHECK(f.entries[0].grid == 2 * 8 * 16);  // 64-row query tiles
  CHECK(f.entries[0].shared_bytes > 48 * 1024);  // double-buffered K/V tiles of 64 x 136 halves
  CHECK(f.entries[0].shared_bytes <= 99 * 1024);
  CHECK(f.source.find("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") != std::string::npos);
  CHECK(f.source.find("cp.async") != std::string::npos);
  c.kind = sched::AttentionCall::Backward;
  codegen::AttentionSource b = codegen::generate_cuda_attention(c, "a");
  REQUIRE(b.entries.size() == 3);
  CHECK(b.entries[0].name == "a_delta");
  CHECK(b.entries[1].name == "a_dq");
  CHECK(b.entries[2].name == "a_dkdv");
  CHECK(b.entries[2].grid == 2 * 2 * 16);  // a block per kv head's 64-key tile
  c.head_dim = c.value_dim = 256;
  b = codegen::generate_cuda_attention(c, "a");
  REQUIRE(b.entries.size() == 4);  // dK and dV apart
  CHECK(b.entries[2].name == "a_dk");
  CHECK(b.entries[3].name == "a_dv");
  for (auto& e : b.entries) CHECK(e.shared_bytes <= 160 * 1024);  // within sm_80's opt-in limit
  c.dtype = DType::Float32;
  b = codegen::generate_cuda_attention(c, "a");
  CHECK(b.source.find("mma.sync") == std::string::npos);
  for (auto& e : b.entries) CHECK(e.shared_bytes <= 48 * 1024);
}

TEST_CASE("cuda attention: a row whose scores are all -inf is 0 even where a value is infinite, in the emulator") {
  // The tensor-core forward weighed such a row's values by 0 and stored 0 * inf = NaN.
  if (!have_host_compiler()) return;
  for (DType dt : {DType::Float16, DType::BFloat16, DType::Float32}) {
    CAPTURE(dtype_name(dt));
    const i64 L = 3, S = 5, E = 16, Ev = 16;  // tensor cores for the half types
    Buf q = make_buf(dt, {1, 1, L, E}, {L * E, L * E, E, 1}), k = make_buf(dt, {1, 1, S, E}, {S * E, S * E, E, 1});
    Buf v = make_buf(dt, {1, 1, S, Ev}, {S * Ev, S * Ev, Ev, 1});
    for (i64 i = 0; i < L; ++i)
      for (i64 e = 0; e < E; ++e) q.set(0, 0, i, e, i == 1 && e == 0 ? -INFINITY : 0.1 * static_cast<double>(e - i));
    for (i64 j = 0; j < S; ++j) {
      for (i64 e = 0; e < E; ++e) k.set(0, 0, j, e, 0.5 + 0.05 * static_cast<double>(j + e));  // positive
      for (i64 e = 0; e < Ev; ++e) v.set(0, 0, j, e, j == 2 && e == 3 ? INFINITY : 0.25 * static_cast<double>(j - e));
    }
    Buf out = make_buf(dt, {1, 1, L, Ev}, {L * Ev, L * Ev, Ev, 1});
    sched::AttentionCall c;
    c.dtype = dt;
    c.batch = 1, c.heads = 1, c.kv_heads = 1, c.q_len = L, c.kv_len = S, c.head_dim = E, c.value_dim = Ev;
    c.scale = 0.25;
    auto slot = [](const Buf& b) {
      sched::Slot s;
      s.kind = sched::Slot::Leaf;
      s.strides = b.strides;
      return s;
    };
    c.q = slot(q), c.k = slot(k), c.v = slot(v), c.out = slot(out);
    Buf lse = make_buf(c.accumulation_dtype(), {1, 1, L, 1}, {L, L, 1, 1});
    c.lse = slot(lse);
    c.kind = sched::AttentionCall::Forward;
    CHECK(c.tensor_cores() == (dt != DType::Float32));
    run(codegen::generate_cuda_attention(c, "katt"), {q.data(), k.data(), v.data(), nullptr, out.data(), lse.data(), nullptr});
    CHECK(lse.get(0, 0, 1, 0) == -INFINITY);
    for (i64 e = 0; e < Ev; ++e) {
      CAPTURE(e);
      CHECK(out.get(0, 0, 1, e) == 0.0);
      CHECK(std::isinf(out.get(0, 0, 0, e)) == (e == 3));  // the other rows weigh key 2 by more than 0
      CHECK(std::isinf(out.get(0, 0, 2, e)) == (e == 3));
    }
  }
}

TEST_CASE("cuda attention: a library attention's rows whose scores are all -inf, in the emulator") {
  // cuDNN leaves such rows at lse -inf with their values weighed by 0: the fix-up after its
  // forward zeroes exactly those output rows (NaN rows stay NaN, the others are untouched).
  // The output written as [B, L, H, Ev] memory.
  sched::AttentionCall c = uniform_call(DType::BFloat16, {2, 3, 3, 5, 4, 8, 6}, {5 * 3 * 6, 6, 3 * 6, 1});
  c.kind = sched::AttentionCall::Forward;
  const codegen::AttentionSource f = codegen::cuda_library_attention_rows(c, "r");
  REQUIRE(f.entries.size() == 1);
  CHECK(f.entries[0].name == "r_zero_rows");
  const std::string fm = nvrtc_check(f.source);
  CHECK_MESSAGE(fm.empty(), "NVRTC: " << fm);
  if (!have_host_compiler()) return;
  const std::int64_t rows = 2 * 3 * 5, n = rows * 6;
  std::vector<float> lse(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r)
    lse[static_cast<std::size_t>(r)] = r % 7 == 3 ? -INFINITY : r % 11 == 4 ? NAN : 0.25f * static_cast<float>(r);
  std::vector<std::uint16_t> out(static_cast<std::size_t>(n), 0x7fc0);  // bf16 NaN everywhere
  run(f, {lse.data(), out.data()});
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < 3; ++h)
      for (std::int64_t l = 0; l < 5; ++l) {
        const std::int64_t r = (b * 3 + h) * 5 + l;
        CAPTURE(r);
        for (std::int64_t d = 0; d < 6; ++d)
          CHECK(out[static_cast<std::size_t>(b * 90 + h * 6 + l * 18 + d)] ==
                (std::isinf(lse[static_cast<std::size_t>(r)]) ? 0 : 0x7fc0));
      }
}

TEST_CASE("cuda attention: a library backward's lse, -inf rows as +inf, in the emulator") {
  // cuDNN's backward takes P = exp(s - lse): for a row whose scores are all -inf, the copy it
  // reads holds +inf (P = 0) where the forward left -inf; every other value, NaN included, as it was.
  sched::AttentionCall c = uniform_call(DType::BFloat16, {2, 3, 3, 5, 4, 8, 6}, {3 * 5 * 6, 5 * 6, 6, 1});
  c.kind = sched::AttentionCall::Backward;
  const codegen::AttentionSource f = codegen::cuda_library_attention_backward_stats(c, "b");
  REQUIRE(f.entries.size() == 1);
  CHECK(f.entries[0].name == "b_stats");
  const std::string fm = nvrtc_check(f.source);
  CHECK_MESSAGE(fm.empty(), "NVRTC: " << fm);
  if (!have_host_compiler()) return;
  const std::size_t rows = 2 * 3 * 5;
  std::vector<float> lse(rows), copy(rows + 1, -1.0f);  // one past the end: untouched
  for (std::size_t r = 0; r < rows; ++r)
    lse[r] = r % 7 == 3 ? -INFINITY : r % 11 == 4 ? NAN : r % 5 == 2 ? INFINITY : -0.5f * static_cast<float>(r);
  run(f, {lse.data(), copy.data()});
  for (std::size_t r = 0; r < rows; ++r) {
    CAPTURE(r);
    if (std::isnan(lse[r]))
      CHECK(std::isnan(copy[r]));
    else
      CHECK(copy[r] == (lse[r] == -INFINITY ? INFINITY : lse[r]));
  }
  CHECK(copy[rows] == -1.0f);
}

}  // namespace kiln_test_codegen_attention_cuda
