#pragma once
// A named, ordered collection of tensors: what Module::state_dict() returns, what
// Optimizer::state_dict() returns and what a safetensors file holds. Order is insertion
// order (PyTorch's state_dict order: registration order, parameters before buffers, depth
// first through children), so files and listings come out the same way every time.
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/tensor/tensor.hpp"

namespace kiln::nn {

/// Ordered name -> Tensor pairs with lookup by name (libtorch's OrderedDict<string, Tensor>).
/// Iterating yields `std::pair<std::string, Tensor>` in insertion order.
class StateDict {
 public:
  using value_type = std::pair<std::string, Tensor>;
  using iterator = std::vector<value_type>::iterator;
  using const_iterator = std::vector<value_type>::const_iterator;

  StateDict() = default;
  StateDict(std::initializer_list<value_type> items) {
    for (const value_type& it : items) insert(it.first, it.second);
  }

  /// Adds `name` at the end; a name already present is a ValueError (names are unique).
  void insert(const std::string& name, Tensor value) {
    if (contains(name)) throw ValueError("StateDict: duplicate key '" + name + "'");
    items_.emplace_back(name, std::move(value));
  }
  /// Sets `name` (replacing its tensor, keeping its place) or adds it at the end.
  void set(const std::string& name, Tensor value) {
    if (Tensor* t = find(name)) {
      *t = std::move(value);
      return;
    }
    items_.emplace_back(name, std::move(value));
  }
  /// The tensor of `name`, or nullptr.
  Tensor* find(const std::string& name) {
    for (value_type& it : items_)
      if (it.first == name) return &it.second;
    return nullptr;
  }
  const Tensor* find(const std::string& name) const {
    for (const value_type& it : items_)
      if (it.first == name) return &it.second;
    return nullptr;
  }
  bool contains(const std::string& name) const { return find(name) != nullptr; }
  /// The tensor of `name`; a missing key is a ValueError naming it.
  Tensor& at(const std::string& name) {
    if (Tensor* t = find(name)) return *t;
    throw ValueError("StateDict: no key '" + name + "'");
  }
  const Tensor& at(const std::string& name) const {
    if (const Tensor* t = find(name)) return *t;
    throw ValueError("StateDict: no key '" + name + "'");
  }
  Tensor& operator[](const std::string& name) { return at(name); }
  const Tensor& operator[](const std::string& name) const { return at(name); }

  std::vector<std::string> keys() const {
    std::vector<std::string> k;
    for (const value_type& it : items_) k.push_back(it.first);
    return k;
  }
  std::size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  iterator begin() { return items_.begin(); }
  iterator end() { return items_.end(); }
  const_iterator begin() const { return items_.begin(); }
  const_iterator end() const { return items_.end(); }

 private:
  std::vector<value_type> items_;
};

}  // namespace kiln::nn
