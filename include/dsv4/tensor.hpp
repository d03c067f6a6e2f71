// dsv4/tensor.hpp — a small owning tensor and a non-owning view, on the CPU or a CUDA device.
//
// The public API takes TensorView (pointer, dtype, shape, row-major contiguous, device) so an
// engine can pass its own buffers; Tensor owns memory for the CLI, tests and the runtime.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "dsv4/device.hpp"
#include "dsv4/dtype.hpp"
#include "dsv4/error.hpp"

namespace dsv4 {

using Shape = std::vector<std::int64_t>;

std::int64_t shape_numel(const Shape& shape);
std::string shape_string(const Shape& shape);  // "[2, 3]"

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape;
  Device device = Device::CPU;

  // An optional argument is absent when its view is the default one (no data, no shape).
  bool given() const { return data != nullptr || !shape.empty(); }
  std::int64_t numel() const { return shape_numel(shape); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  std::int64_t dim(int i) const { return shape.at(static_cast<std::size_t>(i)); }
  template <class T> T* as() const { return static_cast<T*>(data); }
};

// Validates `view` (argument name `name`): dtype, device and shape (-1 in `expected` matches any
// extent). Throws Error(name, "...expected ..., got ...").
void check_tensor(const TensorView& view, const std::string& name, DType dtype, const Shape& expected,
                  Device device);

// A view with its argument name: for argument lists only (it holds a reference to the view).
struct NamedView {
  const TensorView& view;
  const char* name;
};
// Throws Error(name of the output) when an output shares a byte with an input or with a later output
// on the same device (the call would read what it writes, or write one byte twice). Outputs are
// checked in order, each against the inputs, then against the outputs after it. Views of no bytes
// never overlap.
void check_disjoint(std::initializer_list<NamedView> outputs, std::initializer_list<NamedView> inputs);

class Tensor {
 public:
  Tensor() = default;
  // Uninitialized contiguous storage on `device`. Error("shape") for a negative or overflowing extent,
  // Error("dtype") for a dtype outside the enum.
  static Tensor empty(DType dtype, Shape shape, Device device = Device::CPU);
  static Tensor zeros(DType dtype, Shape shape, Device device = Device::CPU);
  // A copy of host data (`bytes` must hold the tensor's byte size; Error("bytes") when null).
  static Tensor from_host(DType dtype, Shape shape, const void* bytes, Device device = Device::CPU);

  DType dtype() const { return view_.dtype; }
  const Shape& shape() const { return view_.shape; }
  Device device() const { return view_.device; }
  std::int64_t numel() const { return view_.numel(); }
  std::size_t nbytes() const { return view_.nbytes(); }
  bool defined() const { return storage_ != nullptr || view_.numel() == 0; }
  void* data() const { return view_.data; }
  template <class T> T* data_as() const { return static_cast<T*>(view_.data); }
  const TensorView& view() const { return view_; }

  // Each of these throws Error("tensor") on a Tensor without storage (default-constructed).
  Tensor to(Device device) const;        // copy to a device (or the host)
  void copy_from(const TensorView& src);  // same dtype and numel; any devices (else Error("src"))
  void fill_bytes(std::uint8_t byte);     // e.g. poisoning before a test

 private:
  void require_storage() const;
  std::shared_ptr<void> storage_;
  TensorView view_;
};

}  // namespace dsv4
