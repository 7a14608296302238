// Test helper: the message of the kvlab::Error that fn throws, or "" when it throws none (tests
// then check the message names the file, key or option).
#pragma once

#include <functional>
#include <string>

#include "framework/core/error.h"

namespace kvlab::testing {

inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace kvlab::testing
