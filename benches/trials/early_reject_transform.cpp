// Cost of the query-side transform of early rejection (issue 28 trial): a dense 384x384
// rotation (PCA or random; axpy form, vectorises without -ffast-math) and a randomized
// Hadamard transform on 512 padded entries, per query, in thread CPU time.
//   g++ -O3 -mavx2 -mfma -o /tmp/ert benches/trials/early_reject_transform.cpp && /tmp/ert
#include <chrono>
#include <ctime>
#include <cstdio>
#include <random>
#include <vector>
static double cpu_us() { timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec * 1e6 + t.tv_nsec * 1e-3; }
int main() {
  const int D = 384, P = 512, R = 200000;
  std::mt19937 g(1);
  std::normal_distribution<float> n;
  std::vector<float> A(D * D), x(D), y(D), h(P), sign(P);
  for (auto& v : A) v = n(g);
  for (auto& v : x) v = n(g);
  for (auto& v : sign) v = n(g) > 0 ? 1.f : -1.f;
  float sink = 0;
  const double t0 = cpu_us();
  for (int r = 0; r < R / 10; ++r) {
    for (int i = 0; i < D; ++i) y[i] = 0;
    for (int j = 0; j < D; ++j) {
      const float xj = x[j] + r * 1e-9f;
      const float* __restrict a = &A[j * D]; float* __restrict yy = y.data();
      for (int i = 0; i < D; ++i) yy[i] += a[i] * xj;
    }
    sink += y[r % D];
  }
  const double t1 = cpu_us();
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < D; ++i) h[i] = sign[i] * (x[i] + r * 1e-9f);
    for (int i = D; i < P; ++i) h[i] = 0;
    for (int len = 1; len < P; len <<= 1)
      for (int i = 0; i < P; i += 2 * len)
        for (int j = i; j < i + len; ++j) {
          const float a = h[j], b = h[j + len];
          h[j] = a + b;
          h[j + len] = a - b;
        }
    sink += h[r % P];
  }
  const double t2 = cpu_us();
  std::printf("dense 384x384 matvec: %.2f us, FWHT-512 (one round, signs): %.3f us (sink %g)\n",
              (t1 - t0) / (R / 10),
              (t2 - t1) / R, sink);
}
