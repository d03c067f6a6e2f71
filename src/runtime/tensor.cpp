// src/runtime/tensor.cpp — storage for Tensor on the host (new[]) or a CUDA device (cudaMalloc).
#include "dsv4/tensor.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <sstream>

#if defined(DSV4_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace dsv4 {

std::int64_t shape_numel(const Shape& shape) {
  // A zero extent empties the tensor whatever the others are: return before any product can wrap.
  for (auto d : shape)
    if (d == 0) return 0;
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string shape_string(const Shape& shape) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

namespace {
// Error(name) unless every extent is non-negative and the byte size fits int64.
// An empty shape (a zero extent) has 0 bytes whatever its other extents, as safetensors files allow.
void check_extents(const Shape& shape, DType dtype, const std::string& name) {
  for (const std::int64_t extent : shape)
    if (extent < 0) throw Error(name, "negative extent in shape " + shape_string(shape));
  if (std::find(shape.begin(), shape.end(), std::int64_t{0}) != shape.end()) return;
  std::int64_t bytes = static_cast<std::int64_t>(dtype_size(dtype));
  for (const std::int64_t extent : shape) {
    // Checked before multiplying: numel() and nbytes() would otherwise wrap.
    if (bytes > std::numeric_limits<std::int64_t>::max() / extent)
      throw Error(name, "shape " + shape_string(shape) + " has more bytes than int64 can count");
    bytes *= extent;
  }
}
}  // namespace

void check_disjoint(std::initializer_list<NamedView> outputs, std::initializer_list<NamedView> inputs) {
  const auto overlap = [](const TensorView& a, const TensorView& b) {
    const std::size_t a_bytes = a.data != nullptr ? a.nbytes() : 0, b_bytes = b.data != nullptr ? b.nbytes() : 0;
    if (a_bytes == 0 || b_bytes == 0 || a.device != b.device) return false;
    const auto a_begin = reinterpret_cast<std::uintptr_t>(a.data), b_begin = reinterpret_cast<std::uintptr_t>(b.data);
    return a_begin < b_begin + b_bytes && b_begin < a_begin + a_bytes;
  };
  for (auto output = outputs.begin(); output != outputs.end(); ++output) {
    for (const NamedView& input : inputs)
      require(!overlap(output->view, input.view), output->name,
              std::string("overlaps ") + input.name + " (a call never writes what it reads)");
    for (auto later = output + 1; later != outputs.end(); ++later)
      require(!overlap(output->view, later->view), output->name,
              std::string("overlaps ") + later->name + " (each output byte has one owner)");
  }
}

void check_tensor(const TensorView& view, const std::string& name, DType dtype, const Shape& expected,
                  Device device) {
  require(view.dtype == dtype, name,
          "expected dtype " + std::string(dtype_name(dtype)) + ", got " + std::string(dtype_name(view.dtype)));
  require(view.device == device, name,
          std::string("expected a tensor on ") + device_name(device) + ", got one on " + device_name(view.device));
  bool same = view.shape.size() == expected.size();
  for (std::size_t i = 0; same && i < expected.size(); ++i) same = expected[i] < 0 || expected[i] == view.shape[i];
  require(same, name, "expected shape " + shape_string(expected) + ", got " + shape_string(view.shape));
  // A wildcard (-1) extent accepts any size, but the view's own extents must still describe memory.
  check_extents(view.shape, view.dtype, name);
  require(view.data != nullptr || view.numel() == 0, name, "null data pointer");
}

namespace {
#if defined(DSV4_WITH_CUDA)
void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error("device", std::string(what) + ": " + cudaGetErrorString(status));
}
#endif

std::shared_ptr<void> allocate(std::size_t bytes, Device device) {
  if (device == Device::CPU) {
    return std::shared_ptr<void>(new std::byte[bytes == 0 ? 1 : bytes], [](void* p) { delete[] static_cast<std::byte*>(p); });
  }
#if defined(DSV4_WITH_CUDA)
  void* p = nullptr;
  cuda_check(cudaMalloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc");
  return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
#else
  throw Error("device", "this build of dsv4 has no CUDA backend");
#endif
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
  if (bytes == 0) return;
  if (dst_device == Device::CPU && src_device == Device::CPU) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if defined(DSV4_WITH_CUDA)
  cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy");
#else
  throw Error("device", "this build of dsv4 has no CUDA backend");
#endif
}
}  // namespace

Tensor Tensor::empty(DType dtype, Shape shape, Device device) {
  // A DType outside the enum (a cast integer) has no size: its storage would hold no byte.
  require(dtype_size(dtype) > 0, "dtype", "unknown dtype " + std::to_string(static_cast<int>(dtype)));
  check_extents(shape, dtype, "shape");
  Tensor t;
  t.view_.dtype = dtype;
  t.view_.shape = std::move(shape);
  t.view_.device = device;
  t.storage_ = allocate(t.nbytes(), device);
  t.view_.data = t.storage_.get();
  return t;
}

Tensor Tensor::zeros(DType dtype, Shape shape, Device device) {
  Tensor t = empty(dtype, std::move(shape), device);
  t.fill_bytes(0);
  return t;
}

Tensor Tensor::from_host(DType dtype, Shape shape, const void* bytes, Device device) {
  check_extents(shape, dtype, "shape");
  require(bytes != nullptr || shape_numel(shape) == 0, "bytes", "null data pointer");
  Tensor t = empty(dtype, std::move(shape), device);
  copy_bytes(t.data(), device, bytes, Device::CPU, t.nbytes());
  return t;
}

void Tensor::require_storage() const {
  require(defined(), "tensor", "has no storage (a default-constructed Tensor holds no element to read or write)");
}

Tensor Tensor::to(Device device) const {
  require_storage();
  Tensor t = empty(dtype(), shape(), device);
  copy_bytes(t.data(), device, data(), this->device(), nbytes());
  return t;
}

void Tensor::copy_from(const TensorView& src) {
  require_storage();
  check_extents(src.shape, src.dtype, "src");
  require(src.dtype == dtype() && src.numel() == numel(), "src",
          "copy needs the same dtype and element count");
  require(src.data != nullptr || src.numel() == 0, "src", "null data pointer");
  copy_bytes(data(), device(), src.data, src.device, nbytes());
}

void Tensor::fill_bytes(std::uint8_t byte) {
  require_storage();
  if (device() == Device::CPU) {
    std::memset(data(), byte, nbytes());
    return;
  }
#if defined(DSV4_WITH_CUDA)
  cuda_check(cudaMemset(data(), byte, nbytes()), "cudaMemset");
#endif
}

}  // namespace dsv4
