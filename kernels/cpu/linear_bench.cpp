// kvlab_bench_linear: the matvec kernel on each instruction set this CPU has, interleaved
// (A B C A B C ...) in one process so that load drift on a shared machine hits all alike.
//
//   kvlab_bench_linear [--rows 2048] [--cols 768] [--matrices 64] [--reps 15]
//
// Per weight type: `matrices` random matrices of rows x cols (by default 64 x 2048 x 768: about
// the 110M model's matrices, more bytes than any cache), one x; each rep multiplies every matrix
// once on one thread with each ISA. Prints the median GB/s of weight bytes streamed per ISA and
// its ratio to AVX2. Not a test (timings).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/linear.h"

int main(int argc, char** argv) {
  using namespace kvlab;
  int64_t rows = 2048, cols = 768;
  int matrices = 64, reps = 15;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const long v = std::atol(argv[i + 1]);
    if (a == "--rows") rows = v;
    else if (a == "--cols") cols = v;
    else if (a == "--matrices") matrices = static_cast<int>(v);
    else if (a == "--reps") reps = static_cast<int>(v);
    else {
      std::fprintf(stderr, "usage: kvlab_bench_linear [--rows N] [--cols N] [--matrices N] [--reps N]\n");
      return 2;
    }
  }
  std::vector<MatvecIsa> isas;
  for (MatvecIsa isa : {MatvecIsa::kAvx2, MatvecIsa::kAvx512})
    if (matvec_isa_supported(isa)) isas.push_back(isa);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(cols), y(rows);
  for (float& v : x) v = nd(rng);
  std::vector<float> src(static_cast<size_t>(rows * cols));
  for (float& v : src) v = nd(rng);
  for (DType type : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ6_K}) {
    const size_t bytes = dtype_bytes(type, rows * cols);
    std::vector<std::vector<uint8_t>> store(matrices, std::vector<uint8_t>(bytes));
    for (auto& m : store) from_float(type, src.data(), m.data(), rows * cols);
    std::vector<std::vector<double>> gbs(isas.size());
    for (int rep = 0; rep < reps; ++rep)
      for (size_t k = 0; k < isas.size(); ++k) {
        const auto t0 = std::chrono::steady_clock::now();
        for (auto& m : store) matvec_rows(WeightView{type, rows, cols, m.data()}, x.data(), 1, y.data(), 0, rows, isas[k]);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        gbs[k].push_back(static_cast<double>(bytes) * matrices / s / 1e9);
      }
    std::printf("%-5s", dtype_name(type));
    double base = 0;
    for (size_t k = 0; k < isas.size(); ++k) {
      std::sort(gbs[k].begin(), gbs[k].end());
      const double med = gbs[k][gbs[k].size() / 2];
      if (k == 0) base = med;
      std::printf("  %s %.2f GB/s (x%.2f)", to_string(isas[k]), med, med / base);
    }
    std::printf("\n");
  }
  return 0;
}
