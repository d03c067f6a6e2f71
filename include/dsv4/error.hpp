// dsv4/error.hpp — the one exception type of the library.
//
// Every public entry point validates its arguments before touching any state; a violation throws
// dsv4::Error naming the offending argument, and leaves every state and cache as it was.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace dsv4 {

class Error : public std::runtime_error {
 public:
  Error(std::string argument, const std::string& reason)
      : std::runtime_error(argument.empty() ? reason : "argument '" + argument + "': " + reason),
        argument_(std::move(argument)) {}

  // The name of the argument (or file, tensor, config key) at fault; may be empty.
  const std::string& argument() const noexcept { return argument_; }

 private:
  std::string argument_;
};

// Throws Error(argument, reason) unless `condition` holds.
inline void require(bool condition, const std::string& argument, const std::string& reason) {
  if (!condition) throw Error(argument, reason);
}

}  // namespace dsv4
