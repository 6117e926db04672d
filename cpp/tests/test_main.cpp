// Runs the tests registered (KBCORE_TEST) in the component file linked with it; prints one
// line per test and the "N passed, N failed" summary; exits non-zero on a failure.
#include <cstdio>
#include <exception>

#include "test_util.h"

namespace kbcore_test {
std::vector<std::pair<const char*, void (*)()>>& registry() {
  static std::vector<std::pair<const char*, void (*)()>> tests;
  return tests;
}
}  // namespace kbcore_test

int main() {
  int passed = 0, failed = 0;
  for (const auto& [name, fn] : kbcore_test::registry()) {
    try {
      fn();
      ++passed;
      std::printf("PASS %s\n", name);
    } catch (const std::exception& e) {
      ++failed;
      std::printf("FAIL %s: %s\n", name, e.what());
    }
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 && passed > 0 ? 0 : 1;
}
