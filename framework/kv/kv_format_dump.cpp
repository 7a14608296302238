// Test helper for tests/reference/kv_format_ref_test.py: stores rows in a KvStore of the given
// format and prints what the store holds, so the NumPy reference can re-derive it bit for bit.
//
//   kv_format_dump FORMAT HEAD_DIM FP8_SCALE [GROUP_SIZE RESIDUAL] < rows.f32 > dump.bin
//
// stdin: n rows of HEAD_DIM float32 (little endian). Each row is appended as the key (and its
// negation as the value) of one token of a one-layer, one-head store with 16-slot blocks. For
// every row, stdout gets: the key's stored codes (row_bytes), the scale its decoded codes are
// multiplied by (float32: int8's row scale, fp8's head scale, else 1), the key as every reader
// gets it (LayerKv::load_key, head_dim float32), then the same three for the value.
// int4 / int2 (KIVI, GROUP_SIZE and RESIDUAL given): first the number q of quantised slots
// (int32); per row the "scale" is the metadata: the key group's s[D] and z[D], the value's
// (s, z) per channel group [D / G][2]; rows at q or later (the fp32 residual) get zero codes and
// metadata, and their values as stored.
// A row the store refuses (NaN, or inf for int8 / fp8): the store's message on stderr, exit 1.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "framework/kv/kv_store.h"

int main(int argc, char** argv) {
  using namespace kvlab;
  try {
    if (argc != 4 && argc != 6) fail("usage: kv_format_dump FORMAT HEAD_DIM FP8_SCALE [GROUP_SIZE RESIDUAL] < rows.f32");
    KvStoreConfig c;
    if (!parse_kv_format(argv[1], &c.format))
      fail("unknown KV format '", argv[1], "' (valid: ", kv_format_names(), ")");
    c.n_layers = 1, c.n_kv_heads = 1, c.head_dim = std::atoi(argv[2]), c.block_size_tokens = 16;
    c.fp8_scale = std::strtof(argv[3], nullptr);
    if (argc == 6) c.group_size = std::atoi(argv[4]), c.residual = std::atoi(argv[5]);
    std::vector<float> rows;
    float buf[4096];
    size_t got;
    while ((got = std::fread(buf, sizeof(float), 4096, stdin)) > 0) rows.insert(rows.end(), buf, buf + got);
    const int D = c.head_dim;
    if (D <= 0 || rows.size() % D != 0) fail("kv_format_dump: input is not a whole number of rows");
    const int n = static_cast<int>(rows.size() / D);
    KvStoreConfig sizing = c;
    sizing.budget_bytes = 0;
    c.budget_bytes = (static_cast<size_t>(n) / 16 + 1) * KvStore(sizing).block_bytes();
    KvStore store(c);
    const SeqId seq = store.create_sequence();
    if (store.reserve(seq, n) != AllocStatus::kOk) fail("kv_format_dump: out of blocks");
    std::vector<float> neg(D);
    for (int i = 0; i < n; ++i) {
      for (int d = 0; d < D; ++d) neg[d] = -rows[static_cast<size_t>(i) * D + d];
      store.append(seq, 0, i, rows.data() + static_cast<size_t>(i) * D, neg.data());
    }
    const LayerKv kv = store.layer(seq, 0);
    const size_t rb = kv.layout.row_bytes();
    std::vector<float> dec(D);
    if (kv.kivi()) {
      const int32_t q = kv.kivi_q_slots;
      std::fwrite(&q, sizeof q, 1, stdout);
      const int G = kv.layout.group_size;
      std::vector<uint8_t> zero_codes(rb, 0);
      std::vector<float> zero_meta(2 * D, 0.f);
      for (int i = 0; i < n; ++i) {
        for (int which = 0; which < 2; ++which) {
          const size_t meta_floats = which == 0 ? 2 * D : 2 * (D / G);
          const bool coded = i < q;
          const uint8_t* codes = !coded ? zero_codes.data() : which == 0 ? kv.key_codes(i, 0) : kv.value_codes(i, 0);
          const float* meta = !coded ? zero_meta.data() : which == 0 ? kv.key_group_meta(i, 0) : kv.value_meta(i, 0);
          if (which == 0) kv.load_key(i, 0, dec.data()); else kv.load_value(i, 0, dec.data());
          std::fwrite(codes, 1, rb, stdout);
          std::fwrite(meta, sizeof(float), meta_floats, stdout);
          std::fwrite(dec.data(), sizeof(float), D, stdout);
        }
      }
      return 0;
    }
    for (int i = 0; i < n; ++i) {
      for (int which = 0; which < 2; ++which) {
        const uint8_t* codes = which == 0 ? kv.key_codes(i, 0) : kv.value_codes(i, 0);
        const float scale = which == 0 ? kv.key_scale(i, 0) : kv.value_scale(i, 0);
        if (which == 0) kv.load_key(i, 0, dec.data()); else kv.load_value(i, 0, dec.data());
        std::fwrite(codes, 1, rb, stdout);
        std::fwrite(&scale, sizeof(float), 1, stdout);
        std::fwrite(dec.data(), sizeof(float), D, stdout);
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kv_format_dump: %s\n", e.what());
    return 1;
  }
}
