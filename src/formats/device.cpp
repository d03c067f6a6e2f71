// src/formats/device.cpp — build-time facts about the backends.
#include "dsv4/device.hpp"

namespace dsv4 {

bool cuda_backend_built() {
#if defined(DSV4_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

}  // namespace dsv4
