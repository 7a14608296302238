// Decode attention throughput: GB/s of KV read next to a memory read bandwidth measured in the
// same run (MACHINE.md: compare ratios, the machine is shared and noisy).
//
//   MemoryReadBandwidth/threads:T   AVX2 sum over a 256 MiB float array
//   DecodeAttention/<ctx>/<heads>/<kv_heads>/<head_dim>/threads:T
//       1 query row over a <ctx>-token cache, block size 16, cold: every iteration reads a
//       different "layer" and the layers together exceed 256 MiB (well past the 32 MiB L3);
//       hot:1 rows keep one small layer in L2, the kernel's compute ceiling.
//   PrefillAttention/<rows>/<ctx>/...  a causal prefill chunk over a warm cache, GFLOP/s.
//   DecodeAttentionTables/.../per_head:P  DecodeAttention (cold, f32) over per-layer (0) or
//       per-head (1) block tables (kernels/common/paged_kv.h): the same bytes, other block ids.
//   DecodeAttentionFormat/<ctx>/<heads>/<kv_heads>/<head_dim>/threads:T/format:F
//       DecodeAttention (cold) over a cache stored in KV format F (kernels/common/kv_format.h:
//       0 f32, 1 bf16, 2 f16, 3 int8, 4 fp8_e4m3, 5 fp8_e5m2, 6 int4, 7 int2: G = 32, every slot
//       quantised); kv_bytes counts the stored bytes
//       (data and metadata). Compare formats by time per call, from interleaved repetitions:
//         kvlab_bench_attention --benchmark_filter=DecodeAttentionFormat \
//           --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true
// Counters: bytes_per_second (KV read: 2 * ctx * kv_heads * head_dim * 4 bytes per call) and
// frac_of_mem_bw (that over the bandwidth measured above with the same thread count), and for
// one thread frac_cpu_time (the same ratio over main-thread CPU time, steadier when the machine
// is oversubscribed).
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"

namespace kvlab {
namespace {

std::map<int, double> g_mem_bw;      // threads -> bytes/s measured by MemoryReadBandwidth
std::map<int, double> g_mem_bw_cpu;  // threads -> bytes per main-thread CPU second

constexpr size_t kBigBytes = size_t{256} << 20;

struct AlignedFloats {
  float* p = nullptr;
  size_t n = 0;
  explicit AlignedFloats(size_t count) : n(count) {
    p = static_cast<float*>(std::aligned_alloc(64, (count * sizeof(float) + 63) / 64 * 64));
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < count; ++i) p[i] = static_cast<float>(i % 7) * 0.01f;  // touch pages
  }
  ~AlignedFloats() { std::free(p); }
};

// Sum of p[0 .. n - n % 32) with 4 AVX accumulators (p 32-byte aligned): a load stream fast
// enough to measure read bandwidth. Target attribute: needs AVX2 at run time whatever
// KVLAB_NATIVE says (every machine kvlab is measured on has it).
__attribute__((target("avx2"))) double sum_avx(const float* p, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  alignas(32) float t[8];
  _mm256_store_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  double total = 0;
  for (float x : t) total += x;
  return total;
}

void MemoryReadBandwidth(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  static AlignedFloats buf(kBigBytes / sizeof(float));
  double sink = 0;
  for (auto _ : state) {
    double total = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : total)
    for (int part = 0; part < threads * 16; ++part) {
      const size_t chunk = buf.n / (threads * 16);
      const float* p = buf.p + part * chunk;
      total += sum_avx(p, chunk);
    }
    sink += total;
  }
  benchmark::DoNotOptimize(sink);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(kBigBytes));
  // Bytes per second of this run, for the attention benchmarks' ratio.
  state.counters["bw"] = benchmark::Counter(static_cast<double>(kBigBytes) * state.iterations(),
                                            benchmark::Counter::kIsRate);
}

// Several layers of one sequence's paged cache, block size 16, blocks laid out as a fresh
// KvStore hands them out (one pool, increasing block ids).
struct DecodeCache {
  int ctx, H, D, bs = 16, n_layers;
  size_t layer_floats;
  AlignedFloats k, v;
  std::vector<int32_t> indices;
  int32_t indptr[2];
  int32_t last_len;
  std::vector<int64_t> positions;
  std::vector<uint8_t> valid;

  int table_heads = 1;  // H: per-head block tables (paged_kv.h), one-head blocks, page-major ids

  DecodeCache(int ctx_, int H_, int D_, int layers, bool fp32_arenas = true, bool per_head_tables = false)
      : ctx(ctx_), H(H_), D(D_), n_layers(layers), table_heads(per_head_tables ? H_ : 1),
        layer_floats(static_cast<size_t>((ctx_ + 15) / 16) * 16 * H_ * D_),
        k(fp32_arenas ? layer_floats * layers : 16), v(fp32_arenas ? layer_floats * layers : 16) {
    const int blocks = (ctx + bs - 1) / bs;
    indices.resize(static_cast<size_t>(blocks) * table_heads * layers);
    for (size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<int32_t>(i);
    indptr[0] = 0;
    indptr[1] = blocks;
    last_len = ctx - (blocks - 1) * bs;
    positions.resize(static_cast<size_t>(ctx) * H);
    for (int s = 0; s < ctx; ++s)
      for (int h = 0; h < H; ++h) positions[static_cast<size_t>(s) * H + h] = s;
    valid.assign(positions.size(), 1);
  }
  LayerKv layer(int l) const {
    LayerKv kv;
    kv.view.page_size = bs;
    kv.view.num_kv_heads = H;
    kv.view.head_dim = D;
    kv.view.k_data = k.p;
    kv.view.v_data = v.p;
    kv.view.indptr = indptr;
    kv.view.indices = indices.data() + static_cast<size_t>(l) * indptr[1] * table_heads;
    kv.view.table_heads = table_heads;
    kv.view.last_page_len = &last_len;
    kv.n_slots = ctx;
    kv.positions = positions.data();
    kv.valid = valid.data();
    return kv;
  }
};

// One decode query row (N(0, 1), seed 1) at position ctx for n_heads query heads, and its
// attention arguments (the cache's layer is set per iteration).
struct DecodeQuery {
  std::vector<float> q, out;
  int64_t qpos;
  AttentionArgs a;
  DecodeQuery(int ctx, int n_heads, int H, int D)
      : q(static_cast<size_t>(n_heads) * D), out(q.size()), qpos(ctx) {
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& x : q) x = nd(rng);
    a = attention_args(q.data(), 1, n_heads, H, D, &qpos, LayerKv{}, 1.f / std::sqrt(static_cast<float>(D)));
    a.out = out.data();
  }
  DecodeQuery(const DecodeQuery&) = delete;
  DecodeQuery& operator=(const DecodeQuery&) = delete;
};

// The timed loop: every iteration attends over the next layer (cold: the layers together
// exceed the caches).
template <class Cache>
void run_layers(benchmark::State& state, const Cache& cache, int layers, AttentionArgs& a, int threads) {
  int l = 0;
  for (auto _ : state) {
    a.kv = cache.layer(l);
    l = (l + 1) % layers;
    attention(a, threads);
    benchmark::ClobberMemory();
  }
}

void DecodeAttention(benchmark::State& state) {
  const int ctx = static_cast<int>(state.range(0)), n_heads = static_cast<int>(state.range(1));
  const int H = static_cast<int>(state.range(2)), D = static_cast<int>(state.range(3));
  const int threads = static_cast<int>(state.range(4));
  const size_t kv_bytes = size_t{2} * ctx * H * D * sizeof(float);
  const bool hot = state.range(5) != 0;  // hot: one small layer that stays in L2 (compute ceiling)
  const int layers =
      hot ? 1 : static_cast<int>(std::max<size_t>(2, (kBigBytes + kv_bytes - 1) / kv_bytes));
  DecodeCache cache(ctx, H, D, layers);
  DecodeQuery query(ctx, n_heads, H, D);
  run_layers(state, cache, layers, query.a, threads);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(kv_bytes));
  state.counters["kv_bytes"] = benchmark::Counter(static_cast<double>(kv_bytes) * state.iterations(),
                                                  benchmark::Counter::kIsRate);
  state.counters["kv_bytes_per_iter"] = static_cast<double>(kv_bytes);
}

// DecodeAttention (cold, f32) with per-layer (0) or per-head (1) block tables: the same bytes, a
// block per (page, KV head) in the order a fresh store hands them out.
void DecodeAttentionTables(benchmark::State& state) {
  const int ctx = static_cast<int>(state.range(0)), n_heads = static_cast<int>(state.range(1));
  const int H = static_cast<int>(state.range(2)), D = static_cast<int>(state.range(3));
  const int threads = static_cast<int>(state.range(4));
  const bool per_head = state.range(5) != 0;
  const size_t kv_bytes = size_t{2} * ctx * H * D * sizeof(float);
  const int layers = static_cast<int>(std::max<size_t>(2, (kBigBytes + kv_bytes - 1) / kv_bytes));
  DecodeCache cache(ctx, H, D, layers, true, per_head);
  DecodeQuery query(ctx, n_heads, H, D);
  run_layers(state, cache, layers, query.a, threads);
  state.SetLabel(per_head ? "per_head" : "per_layer");
  state.counters["kv_bytes_per_iter"] = static_cast<double>(kv_bytes);
}

// The same layers stored in a KV format: K and V arenas of KvBlockLayout blocks (codes and the
// per-row metadata), filled with N(0, 1) rows encoded once and copied to every layer.
struct FormatCache {
  DecodeCache meta;  // positions, valid, block table (its fp32 arenas stay 1 block: unused)
  KvBlockLayout layout;
  size_t layer_bytes;
  std::vector<float> head_scale;
  uint8_t* k = nullptr;
  uint8_t* v = nullptr;
  FormatCache(int ctx, int H, int D, int layers, KvFormat format)
      : meta(ctx, H, D, layers, /*fp32_arenas=*/false), layout{format, 16, H, D, 32},
        layer_bytes(static_cast<size_t>((ctx + 15) / 16) * layout.block_bytes()),
        head_scale(static_cast<size_t>(H), 0.25f) {
    const size_t total = layer_bytes * layers;
    k = static_cast<uint8_t*>(std::aligned_alloc(64, (total + 63) / 64 * 64));
    v = static_cast<uint8_t*>(std::aligned_alloc(64, (total + 63) / 64 * 64));
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> row(D);
    const int blocks = (ctx + 15) / 16;
    if (kv_format_is_kivi(format)) {  // random codes, plausible (s, z): decoding costs the same
      for (size_t i = 0; i < layer_bytes; ++i) k[i] = v[i] = static_cast<uint8_t>(rng());
      for (int b = 0; b < blocks; ++b)
        for (uint8_t* arena : {k, v}) {
          float* meta = reinterpret_cast<float*>(arena + static_cast<size_t>(b) * layout.block_bytes() + layout.meta_begin());
          const size_t n = (layout.block_bytes() - layout.meta_begin()) / 4;
          for (size_t i = 0; i < n; ++i) meta[i] = i % 2 ? -0.5f : 0.07f;
        }
    } else
    for (int b = 0; b < blocks; ++b)
      for (int h = 0; h < H; ++h)
        for (int e = 0; e < 16; ++e)
          for (uint8_t* arena : {k, v}) {
            for (auto& x : row) x = nd(rng);
            uint8_t* blk = arena + static_cast<size_t>(b) * layout.block_bytes();
            float scale = head_scale[h];
            kv_encode_row(format, row.data(), D, head_scale[h], blk + layout.row_offset(h, e), &scale);
            if (format == KvFormat::kInt8) std::memcpy(blk + layout.meta_offset(h, e), &scale, 4);
          }
    for (int l = 1; l < layers; ++l) {
      std::memcpy(k + l * layer_bytes, k, layer_bytes);
      std::memcpy(v + l * layer_bytes, v, layer_bytes);
    }
  }
  ~FormatCache() { std::free(k); std::free(v); }
  LayerKv layer(int l) const {
    LayerKv kv = meta.layer(l);
    kv.view.k_data = kv.view.v_data = nullptr;
    kv.layout = layout;
    kv.k_bytes = k;
    kv.v_bytes = v;
    kv.k_head_scale = kv.v_head_scale = head_scale.data();
    kv.kivi_q_slots = kv.n_slots;  // KIVI: every slot quantised (R = 128 of 16k would be < 1% fp32)
    return kv;
  }
};

void DecodeAttentionFormat(benchmark::State& state) {
  const int ctx = static_cast<int>(state.range(0)), n_heads = static_cast<int>(state.range(1));
  const int H = static_cast<int>(state.range(2)), D = static_cast<int>(state.range(3));
  const int threads = static_cast<int>(state.range(4));
  const KvFormat format = kAllKvFormats[state.range(5)];
  const size_t kv_bytes = size_t{2} * static_cast<size_t>((ctx + 15) / 16) * KvBlockLayout{format, 16, H, D, 32}.block_bytes();
  const int layers = static_cast<int>(std::max<size_t>(2, (kBigBytes + kv_bytes - 1) / kv_bytes));
  DecodeQuery query(ctx, n_heads, H, D);
  if (format == KvFormat::kF32) {
    DecodeCache cache(ctx, H, D, layers);
    run_layers(state, cache, layers, query.a, threads);
  } else {
    FormatCache cache(ctx, H, D, layers, format);
    run_layers(state, cache, layers, query.a, threads);
  }
  state.SetLabel(kv_format_name(format));
  state.counters["kv_bytes"] = benchmark::Counter(static_cast<double>(kv_bytes) * state.iterations(),
                                                  benchmark::Counter::kIsRate);
  state.counters["kv_bytes_per_iter"] = static_cast<double>(kv_bytes);
}

// Prefill chunk: the last `rows` tokens of a ctx-token cache attend causally (full selection),
// reported as GFLOP/s of the score and PV products (4 * head_dim flops per visible (row, head, key)).
void PrefillAttention(benchmark::State& state) {
  const int rows = static_cast<int>(state.range(0)), ctx = static_cast<int>(state.range(1));
  const int n_heads = static_cast<int>(state.range(2)), H = static_cast<int>(state.range(3));
  const int D = static_cast<int>(state.range(4)), threads = static_cast<int>(state.range(5));
  DecodeCache cache(ctx, H, D, 1);
  std::vector<float> q(static_cast<size_t>(rows) * n_heads * D), out(q.size());
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& x : q) x = nd(rng);
  std::vector<int64_t> qpos(rows);
  double visible = 0;
  for (int r = 0; r < rows; ++r) {
    qpos[r] = ctx - rows + r;
    visible += static_cast<double>(qpos[r] + 1);
  }
  AttentionArgs a;
  a.q = q.data();
  a.n_rows = rows;
  a.n_heads = n_heads;
  a.n_kv_heads = H;
  a.head_dim = D;
  a.q_positions = qpos.data();
  a.kv = cache.layer(0);
  a.scale = 1.f / std::sqrt(static_cast<float>(D));
  a.out = out.data();
  for (auto _ : state) {
    attention(a, threads);
    benchmark::ClobberMemory();
  }
  state.counters["GFLOPs"] = benchmark::Counter(
      4.0 * D * n_heads * visible * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

}  // namespace
}  // namespace kvlab

// Records the bandwidth measured per thread count and adds, to every DecodeAttention run,
// mem_GBps (that bandwidth) and frac_of_mem_bw (KV bytes/s over it).
class BandwidthRatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    std::vector<Run> out = runs;
    for (Run& r : out) {
      const std::string name = r.benchmark_name();
      const int threads = name.find("/threads:2") != std::string::npos ||
                                  name.find("MemoryReadBandwidth/2") != std::string::npos
                              ? 2 : 1;
      // Bytes per CPU second of the main thread: on a shared, oversubscribed machine this is
      // the steadier single-thread figure (real time includes time the thread was preempted).
      const double cpu_s_per_iter = r.cpu_accumulated_time / std::max<int64_t>(1, r.iterations);
      if (name.find("MemoryReadBandwidth") != std::string::npos && r.counters.count("bw")) {
        kvlab::g_mem_bw[threads] = r.counters.at("bw").value;
        kvlab::g_mem_bw_cpu[threads] = static_cast<double>(kvlab::kBigBytes) / cpu_s_per_iter;
      } else if (name.find("DecodeAttention") != std::string::npos && r.counters.count("kv_bytes")) {
        const double kv = r.counters.at("kv_bytes").value;  // bytes/s (a rate counter)
        auto it = kvlab::g_mem_bw.find(threads);
        r.counters["kv_GBps"] = kv / 1e9;
        if (it != kvlab::g_mem_bw.end()) {
          r.counters["mem_GBps"] = it->second / 1e9;
          r.counters["frac_of_mem_bw"] = kv / it->second;
        }
        auto cpu = kvlab::g_mem_bw_cpu.find(threads);
        if (threads == 1 && cpu != kvlab::g_mem_bw_cpu.end() && r.counters.count("kv_bytes_per_iter"))
          r.counters["frac_cpu_time"] =
              r.counters.at("kv_bytes_per_iter").value / cpu_s_per_iter / cpu->second;
        r.counters.erase("kv_bytes");
        r.counters.erase("kv_bytes_per_iter");
      }
    }
    ConsoleReporter::ReportRuns(out);
  }
};

BENCHMARK(kvlab::MemoryReadBandwidth)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(kvlab::DecodeAttention)
    ->ArgNames({"ctx", "heads", "kv_heads", "head_dim", "threads", "hot"})
    ->Args({4096, 8, 8, 64, 1, 0})->Args({4096, 8, 8, 64, 2, 0})
    ->Args({16384, 8, 8, 64, 1, 0})->Args({16384, 8, 8, 64, 2, 0})
    ->Args({4096, 32, 8, 128, 1, 0})->Args({4096, 32, 8, 128, 2, 0})
    ->Args({16384, 32, 8, 128, 1, 0})->Args({16384, 32, 8, 128, 2, 0})
    // Compute ceilings: 256 KiB of KV that stays in L2.
    ->Args({256, 8, 8, 64, 1, 1})->Args({128, 32, 8, 128, 1, 1})
    ->Unit(benchmark::kMicrosecond)->UseRealTime();

// The 110M shape (12 heads, head_dim 64, MHA) at 16k context, every format, 1 and 2 threads.
BENCHMARK(kvlab::DecodeAttentionFormat)
    ->ArgNames({"ctx", "heads", "kv_heads", "head_dim", "threads", "format"})
    ->ArgsProduct({{16384}, {12}, {12}, {64}, {1, 2}, {0, 1, 2, 3, 4, 5, 6, 7}})
    ->Unit(benchmark::kMicrosecond)->UseRealTime();

BENCHMARK(kvlab::DecodeAttentionTables)
    ->ArgNames({"ctx", "heads", "kv_heads", "head_dim", "threads", "per_head"})
    ->ArgsProduct({{16384}, {12}, {12}, {64}, {1}, {0, 1}})
    ->ArgsProduct({{16384}, {32}, {8}, {128}, {1}, {0, 1}})
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(kvlab::PrefillAttention)
    ->ArgNames({"rows", "ctx", "heads", "kv_heads", "head_dim", "threads"})
    ->Args({256, 2048, 32, 8, 128, 1})->Args({256, 2048, 32, 8, 128, 2})
    ->Unit(benchmark::kMillisecond)->UseRealTime();

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  BandwidthRatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
