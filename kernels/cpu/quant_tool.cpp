// kvlab_quant_tool: kvlab's block (de)quantisers on raw files, for the reference tests that
// compare them with gguf-py (tests/reference/quants_ref_test.py).
//   kvlab_quant_tool dequant TYPE IN OUT   IN: whole blocks of TYPE; OUT: float32 values
//   kvlab_quant_tool quant TYPE IN OUT     IN: float32 values (a multiple of the block); OUT: blocks
// TYPE is a kvlab dtype name (q4_0 ... q6_k). Errors: one line on stderr, exit status 1.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/cpu/dtype.h"
#include "kernels/cpu/quant_blocks.h"

namespace {

std::vector<char> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) kvlab::fail(path, ": cannot open");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const std::string& path, const void* data, size_t bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!out) kvlab::fail(path, ": cannot write");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc != 5) kvlab::fail("usage: kvlab_quant_tool dequant|quant TYPE IN OUT");
    const std::string mode = argv[1];
    const kvlab::DType t = kvlab::parse_dtype(argv[2]);
    if (!kvlab::is_block_quant(t)) kvlab::fail(argv[2], " is not a block-quantised type");
    const std::vector<char> in = read_all(argv[3]);
    const auto bv = kvlab::quant_block_values(t);
    const auto bb = kvlab::quant_block_bytes(t);
    if (mode == "dequant") {
      if (in.size() % bb != 0) kvlab::fail(argv[3], ": ", in.size(), " bytes, not whole ", argv[2], " blocks");
      const int64_t n = static_cast<int64_t>(in.size() / bb) * bv;
      std::vector<float> out(static_cast<size_t>(n));
      kvlab::dequantize_blocks(t, in.data(), out.data(), n);
      write_all(argv[4], out.data(), out.size() * 4);
    } else if (mode == "quant") {
      const int64_t n = static_cast<int64_t>(in.size() / 4);
      std::vector<float> x(static_cast<size_t>(n));
      std::copy_n(in.data(), n * 4, reinterpret_cast<char*>(x.data()));
      std::vector<char> out(static_cast<size_t>(n / bv) * bb);
      kvlab::quantize_blocks(t, x.data(), out.data(), n);
      write_all(argv[4], out.data(), out.size());
    } else {
      kvlab::fail("unknown mode '", mode, "' (expected dequant or quant)");
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvlab_quant_tool: %s\n", e.what());
    return 1;
  }
}
