// Distance kernels: every SIMD level this CPU runs agrees with the scalar kernels.

#include <cmath>
#include <random>
#include <vector>

#include "distance.h"
#include "test_util.h"

using namespace kbcore_test;

KBCORE_TEST(kernels_agree_with_scalar) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (std::size_t dim : {1, 3, 7, 8, 15, 16, 17, 31, 33, 64, 100, 384}) {
    std::vector<float> a(dim), b(dim * 4);
    for (auto& v : a) v = u(rng);
    for (auto& v : b) v = u(rng);
    const auto& s = kbcore::kernels_for(kbcore::SimdLevel::kScalar);
    for (auto level : kbcore::supported_simd_levels()) {
      const auto& k = kbcore::kernels_for(level);
      CHECK(std::fabs(k.dot(a.data(), b.data(), dim) - s.dot(a.data(), b.data(), dim)) < 1e-4f);
      CHECK(std::fabs(k.l2sq(a.data(), b.data(), dim) - s.l2sq(a.data(), b.data(), dim)) < 1e-4f);
      const float* rows[4] = {b.data(), b.data() + dim, b.data() + 2 * dim, b.data() + 3 * dim};
      float out[4], ref[4];
      k.dot4(a.data(), rows, dim, out);
      s.dot4(a.data(), rows, dim, ref);
      for (int j = 0; j < 4; ++j) CHECK(std::fabs(out[j] - ref[j]) < 1e-4f);
      k.l2sq4(a.data(), rows, dim, out);
      s.l2sq4(a.data(), rows, dim, ref);
      for (int j = 0; j < 4; ++j) CHECK(std::fabs(out[j] - ref[j]) < 1e-4f);
    }
  }
}
