// Exceptions that cross into Python with a precise type.
// pybind11 translates std::invalid_argument to ValueError; every message names the offending parameter
// and what is allowed (the messages are built with fmt).
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace speculant {

// Bad input: a parameter, a prompt, a model that breaks the contract, or non-finite logits at run time.
struct ValueError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw ValueError(fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
void require(bool condition, fmt::format_string<Args...> format, Args&&... args) {
  if (!condition) fail(format, std::forward<Args>(args)...);
}

}  // namespace speculant
