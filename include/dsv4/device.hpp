// dsv4/device.hpp — where an operation runs.
#pragma once

#include <string>
#include <string_view>

#include "dsv4/error.hpp"

namespace dsv4 {

enum class Device { CPU, CUDA };

inline const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

// Parses "cpu" or "cuda"; `argument` names the option in the error message.
inline Device parse_device(std::string_view text, const std::string& argument = "device") {
  if (text == "cpu") return Device::CPU;
  if (text == "cuda") return Device::CUDA;
  throw Error(argument, "unknown device '" + std::string(text) + "' (expected cpu or cuda)");
}

// True when the library was built with its CUDA backend (a GPU may still be absent at run time).
bool cuda_backend_built();

}  // namespace dsv4
