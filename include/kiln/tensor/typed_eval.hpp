#pragma once
// The fast path of `t.assign(expr)` for a typed expression: the expression's type gives its
// structure at compile time (kStructKey), so a cached evaluation needs no graph nodes, no
// capture and no hashing of a graph — only a guard over the leaves' layouts and the numbers in
// the expression, a lookup, and the launch. The first evaluation of a new guard takes the
// ordinary path (build, capture) and remembers the captured graph and where each of its leaves
// comes from.
#include <atomic>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "kiln/tensor/eval.hpp"

namespace kiln::detail {

/// Bumped by kiln::reset(): entries of every thread made before it are ignored.
inline std::atomic<std::uint64_t>& typed_cache_generation() {
  static std::atomic<std::uint64_t> g{1};
  return g;
}

/// The leaves of a typed expression, left to right, and the words its guard compares.
struct TypedLeaves {
  static constexpr std::size_t kMaxTensors = 16;
  static constexpr std::size_t kMaxWords = 160;
  const ir::Node* tensors[kMaxTensors];
  std::size_t num_tensors = 0;
  std::int64_t words[kMaxWords];
  std::size_t num_words = 0;
  bool ok = true;                 ///< false: too many leaves, a lazy leaf, or another device (take the slow path)
  Device device = Device::cpu();  ///< where the expression is evaluated (decides which numbers are arguments)
  /// Numbers that are kernel arguments: not in the guard; their values, and the 8-byte slots
  /// the launch reads them from (written in the leaf's dtype once the entry is known).
  static constexpr std::size_t kMaxNumbers = 16;
  struct Number {
    double as_double;
    std::int64_t as_int;
    bool integral;
  };
  Number numbers[kMaxNumbers];
  std::size_t num_numbers = 0;
  alignas(8) unsigned char slots[kMaxNumbers][8];
  /// Which pointwise nodes, in visiting order, autocast made float32 (one expression type
  /// builds different graphs with and without autocast; the guard ends with this mask).
  std::uint64_t autocast_mask = 0;
  std::size_t pointwise_nodes = 0;

  void word(std::int64_t w) {
    if (num_words < kMaxWords)
      words[num_words++] = w;
    else
      ok = false;
  }
  void pointwise(bool autocast) {
    if (autocast) {
      if (pointwise_nodes < 64)
        autocast_mask |= std::uint64_t{1} << pointwise_nodes;
      else
        ok = false;
    }
    ++pointwise_nodes;
  }
  void tensor(const Tensor& t) {
    const ir::Node* n = t.node().get();
    if (!n || !n->realized() || num_tensors == kMaxTensors) {
      ok = false;
      return;
    }
    // Two leaves over the same memory change the captured graph (one leaf, not two).
    std::int64_t alias = -1;
    for (std::size_t i = 0; i < num_tensors; ++i)
      if (tensors[i]->buffer->storage == n->buffer->storage && tensors[i]->buffer->offset == n->buffer->offset) {
        alias = static_cast<std::int64_t>(i);
        break;
      }
    tensors[num_tensors++] = n;
    word(static_cast<std::int64_t>(n->dtype) | (static_cast<std::int64_t>(n->device.kind) << 8) |
         (static_cast<std::int64_t>(n->device.index) << 16) | (static_cast<std::int64_t>(n->shape.size()) << 32));
    word(alias);
    for (std::size_t d = 0; d < n->shape.size(); ++d) {
      word(n->shape[d]);
      word(n->buffer->strides[d]);
    }
  }
  template <class T>
  void number(const ScalarExpr<T>& s) {
    const T v = s.value;
    if (number_is_argument(s, device)) {
      // Only that it is an argument is guarded, not its value: one entry serves every value.
      word(0x6e756d626572);
      if (num_numbers == kMaxNumbers) {
        ok = false;
        return;
      }
      Number num{static_cast<double>(v), 0, std::is_integral_v<T>};
      if constexpr (std::is_integral_v<T>) num.as_int = static_cast<std::int64_t>(v);
      numbers[num_numbers++] = num;
      return;
    }
    double d = static_cast<double>(v);
    std::int64_t bits;
    std::memcpy(&bits, &d, 8);
    word(bits);
    if constexpr (std::is_integral_v<T>) word(static_cast<std::int64_t>(v));  // exact beyond 2^53
  }
};

template <class E>
void collect_leaves(const E& e, TypedLeaves& out) {
  if constexpr (std::is_same_v<E, Tensor>)
    out.tensor(e);
  else if constexpr (is_scalar_expr<E>::value)
    out.number(e);
  else {
    if constexpr (requires { e.autocast; }) out.pointwise(e.autocast);
    e.for_each_child([&out](const auto& child) { collect_leaves(child, out); });
  }
}

struct TypedEntry {
  std::vector<std::int64_t> words;
  std::uint64_t generation = 0;
  std::shared_ptr<const backend::PreparedGraph> prepared;
  std::vector<std::int32_t> leaf_source;  ///< per graph leaf: tensor leaf i (>= 0) or number argument -i-1
  std::vector<DType> number_dtype;        ///< per number argument: the dtype its leaf holds
};

inline std::uint64_t hash_words(std::uint64_t seed, const std::int64_t* w, std::size_t n) {
  std::uint64_t h = seed;
  for (std::size_t i = 0; i < n; ++i) h = hash_combine(h, static_cast<std::uint64_t>(w[i]));
  return h;
}

/// Evaluates typed expression `value` into the realized `dest`; false when the fast path does
/// not apply (the caller takes the general path).
template <class E>
bool typed_assign(const E& value, const ir::NodePtr& dest) {
  TypedLeaves leaves;
  leaves.device = dest->device;
  collect_leaves(value, leaves);
  if (!leaves.ok) return false;
  const ir::BufferView& dst = *dest->buffer;
  for (std::size_t i = 0; i < leaves.num_tensors; ++i)
    if (leaves.tensors[i]->buffer->storage == dst.storage || leaves.tensors[i]->device != dest->device) return false;
  // The destination's layout is part of the guard too.
  TypedLeaves& L = leaves;
  L.word(static_cast<std::int64_t>(dest->dtype) | (static_cast<std::int64_t>(dest->shape.size()) << 32));
  for (std::size_t d = 0; d < dest->shape.size(); ++d) {
    L.word(dest->shape[d]);
    L.word(dst.strides[d]);
  }
  L.word(static_cast<std::int64_t>(backend_mode()));
  if (L.autocast_mask) {
    L.word(0x6175746f63617374);  // "autocast"
    L.word(static_cast<std::int64_t>(L.autocast_mask));
  }
  if (!L.ok) return false;

  thread_local std::unordered_multimap<std::uint64_t, TypedEntry> cache;
  const std::uint64_t generation = typed_cache_generation().load(std::memory_order_relaxed);
  const std::uint64_t key = hash_words(E::kStructKey, L.words, L.num_words);
  TypedEntry* entry = nullptr;
  auto range = cache.equal_range(key);
  for (auto it = range.first; it != range.second; ++it) {
    TypedEntry& e = it->second;
    if (e.words.size() == L.num_words &&
        std::memcmp(e.words.data(), L.words, L.num_words * sizeof(std::int64_t)) == 0) {
      if (e.generation != generation) {
        cache.erase(it);
        break;
      }
      entry = &e;
      count_plan_hit();
      break;
    }
  }
  if (!entry) {
    // First time for this guard: build and capture as the general path does, and remember
    // where each captured leaf comes from among the expression's tensors.
    std::vector<const Storage*> number_storages;
    number_leaf_recorder = &number_storages;
    Tensor v;
    try {
      v = Tensor(value);
    } catch (...) {
      number_leaf_recorder = nullptr;
      throw;
    }
    number_leaf_recorder = nullptr;
    if (number_storages.size() != L.num_numbers) return false;  // cannot happen: both walk the same numbers
    ir::NodePtr n = decomp::expand(ir::cast(v.node(), dest->dtype), dest->shape);
    ir::Captured c = ir::capture({n}, dest->device);
    TypedEntry e;
    e.words.assign(L.words, L.words + L.num_words);
    e.generation = generation;
    e.number_dtype.assign(L.num_numbers, DType::Float32);
    for (auto& leaf : c.leaves) {
      std::int32_t src = -1;
      bool found = false;
      for (std::size_t i = 0; i < L.num_tensors && !found; ++i)
        if (L.tensors[i]->buffer->storage == leaf->buffer->storage &&
            L.tensors[i]->buffer->offset == leaf->buffer->offset) {
          src = static_cast<std::int32_t>(i);
          found = true;
        }
      for (std::size_t k = 0; k < number_storages.size() && !found; ++k)
        if (number_storages[k] == leaf->buffer->storage.get()) {
          src = -static_cast<std::int32_t>(k) - 1;
          e.number_dtype[k] = leaf->dtype;
          found = true;
        }
      if (!found) return false;  // a leaf the expression does not name (cannot happen today)
      e.leaf_source.push_back(src);
    }
    c.graph.output_strides[0] = dst.strides;
    c.graph.rehash();
    if (log_enabled(LogChannel::graph)) log(LogChannel::graph, "evaluating graph\n" + c.graph.str());
    e.prepared = backend::entry::prepare(std::move(c.graph), backend_mode(), backend::CpuLaunchOptions{}, true);
    entry = &cache.emplace(key, std::move(e))->second;
  }
  for (std::size_t k = 0; k < L.num_numbers; ++k) {
    const TypedLeaves::Number& num = L.numbers[k];
    if (num.integral)
      store_number(num.as_int, entry->number_dtype[k], L.slots[k]);
    else
      store_number(num.as_double, entry->number_dtype[k], L.slots[k]);
  }
  backend::RunArgs args;
  args.inputs.reserve(entry->leaf_source.size());
  for (auto src : entry->leaf_source)
    args.inputs.push_back(src >= 0 ? leaf_pointer(*L.tensors[src]) : static_cast<const void*>(L.slots[-src - 1]));
  args.outputs.push_back(static_cast<char*>(dst.storage->data) +
                         dst.offset * static_cast<std::int64_t>(itemsize(dest->dtype)));
  backend::entry::run_prepared(*entry->prepared, args);
  counters().graphs++;
  return true;
}

}  // namespace kiln::detail
