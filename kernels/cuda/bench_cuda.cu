// Benchmarks of the CUDA kernels (not tests): writes one CSV row per case.
//   kvlab_cuda_bench [--csv PATH] [--quick]
// decode: batch 64 x 8192-token contexts, 32 query / 8 KV heads, head dim 128, bf16, pages of 16
//   in shuffled order; full, 25% page selection, each with and without the H2O key mass.
//   Figure of merit: KV bytes read (K and V of the selected slots) / time, in TB/s.
// prefill: one 16k-token causal chunk, 32 / 8 heads, head dim 128, bf16; FLOPs counted as
//   4 * heads * head_dim * (number of unmasked (query, key) pairs), in TFLOP/s.
// Times: CUDA events, median of `iters` launches after warm-up.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/prefill_attention.h"

namespace kvlab::cuda {
namespace {

// Uniform values in [-1, 1) from a hash of the index (no host round trip for gigabytes).
template <class T>
__global__ void fill_hash(T* data, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed ^ static_cast<uint32_t>(i >> 32);
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    const float u = (x >> 8) * (1.f / 8388608.f) - 1.f;
    if constexpr (std::is_same_v<T, float>) {
      data[i] = u;
    } else {
      data[i] = __float2bfloat16_rn(u);
    }
  }
}

template <class T>
void fill(DeviceBuffer<T>& buf, uint32_t seed) {
  fill_hash<T><<<1024, 256>>>(buf.data(), buf.size(), seed);
  KVLAB_CUDA_CHECK_LAUNCH();
}

double median_ms(const std::function<void()>& fn, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t start, stop;
  KVLAB_CUDA_CHECK(cudaEventCreate(&start));
  KVLAB_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    KVLAB_CUDA_CHECK(cudaEventRecord(start));
    fn();
    KVLAB_CUDA_CHECK(cudaEventRecord(stop));
    KVLAB_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    KVLAB_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

struct Row {
  std::string bench, kase;
  int batch, ctx, hq, hkv, d, page;
  double selected_frac;
  int key_mass, splits;
  double ms, bytes, flops;
};

std::string csv_header() {
  return "bench,case,dtype,batch,ctx,num_qo_heads,num_kv_heads,head_dim,page_size,selected_frac,"
         "key_mass,splits,time_ms,bytes,tb_per_s,tflop_per_s";
}
std::string csv_line(const Row& r) {
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%s,%s,bf16,%d,%d,%d,%d,%d,%d,%.4f,%d,%d,%.4f,%.0f,%.3f,%.2f",
                r.bench.c_str(), r.kase.c_str(), r.batch, r.ctx, r.hq, r.hkv, r.d, r.page,
                r.selected_frac, r.key_mass, r.splits, r.ms, r.bytes,
                r.bytes > 0 ? r.bytes / (r.ms * 1e-3) / 1e12 : 0.0,
                r.flops > 0 ? r.flops / (r.ms * 1e-3) / 1e12 : 0.0);
  return buf;
}

void bench_decode(std::vector<Row>& rows, bool quick) {
  using T = __nv_bfloat16;
  const int batch = quick ? 8 : 64, ctx = 8192, hq = 32, hkv = 8, d = 128, page = 16;
  const int pages_per_seq = ctx / page, num_pages = batch * pages_per_seq;
  DeviceBuffer<T> k(size_t(num_pages) * hkv * page * d), v(k.size());
  fill(k, 1);
  fill(v, 2);
  DeviceBuffer<float> q(size_t(batch) * hq * d), out(q.size()), lse(size_t(batch) * hq);
  fill(q, 3);
  std::mt19937 rng(42);
  std::vector<int32_t> pool(num_pages), indptr{0}, last(batch, page);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  for (int b = 0; b < batch; ++b) indptr.push_back((b + 1) * pages_per_seq);
  DeviceBuffer<int32_t> dindptr(indptr), dindices(pool), dlast(last);
  std::vector<int32_t> pos_host(size_t(num_pages) * hkv * page);
  for (int b = 0; b < batch; ++b)
    for (int pi = 0; pi < pages_per_seq; ++pi)
      for (int h = 0; h < hkv; ++h)
        for (int e = 0; e < page; ++e)
          pos_host[(size_t(pool[b * pages_per_seq + pi]) * hkv + h) * page + e] = pi * page + e;
  DeviceBuffer<int32_t> dpos(pos_host);
  // 25% of the pages of every (request, KV head), the last page always among them.
  std::vector<int32_t> sel_indptr{0};
  std::vector<SlotRange> ranges;
  for (int l = 0; l < batch * hkv; ++l) {
    std::vector<int> chosen(pages_per_seq);
    std::iota(chosen.begin(), chosen.end(), 0);
    std::shuffle(chosen.begin(), chosen.end() - 1, rng);
    std::vector<int> pick(chosen.begin(), chosen.begin() + pages_per_seq / 4 - 1);
    pick.push_back(pages_per_seq - 1);
    std::sort(pick.begin(), pick.end());
    for (int p : pick) ranges.push_back({p * page, (p + 1) * page});
    sel_indptr.push_back(static_cast<int32_t>(ranges.size()));
  }
  const std::vector<int32_t> offsets = build_key_offsets(sel_indptr, ranges);
  DeviceBuffer<int32_t> dsel_indptr(sel_indptr), dsel_off(offsets);
  DeviceBuffer<SlotRange> dranges(ranges);
  DeviceBuffer<float> mass(size_t(batch) * hkv * ctx);
  mass.zero();

  DecodeParams<T> p;
  p.kv = {page, hkv, d, k.data(), v.data(), dindptr.data(), dindices.data(), dlast.data()};
  p.q = q.data();
  p.batch = batch;
  p.num_qo_heads = hq;
  p.scale = 1.f / std::sqrt(float(d));
  p.out = out.data();
  p.lse = lse.data();
  // The card's copy ceiling in the same run: device-to-device copy of the K pages into the V
  // pages (bytes read + written).
  {
    const double ms = median_ms([&] {
      KVLAB_CUDA_CHECK(cudaMemcpyAsync(v.data(), k.data(), k.bytes(), cudaMemcpyDeviceToDevice));
    }, 2, quick ? 3 : 10);
    rows.push_back({"copy", "device_to_device", batch, ctx, hq, hkv, d, page, 1.0, 0, 1, ms,
                    2.0 * k.bytes(), 0});
    std::printf("%s\n", csv_line(rows.back()).c_str());
    fill(v, 2);
  }
  DecodeWorkspace ws;
  const double kv_bytes_per_key = 2.0 * d * sizeof(T);
  for (int with_sel = 0; with_sel < 2; ++with_sel) {
    for (int with_pos = 0; with_pos < 2; ++with_pos) {
      for (int with_mass = 0; with_mass < 2; ++with_mass) {
        DecodeParams<T> c = p;
        const int keys = with_sel ? pages_per_seq / 4 * page : ctx;
        if (with_sel) c.sel = {dsel_indptr.data(), dranges.data(), dsel_off.data()};
        if (with_pos) c.kv_pos = dpos.data();
        if (with_mass) {
          c.key_mass = mass.data();
          c.key_mass_stride = ctx;
        }
        const DecodePlan plan = plan_decode(batch, hkv, keys);
        const double ms = median_ms([&] { decode_attention<T>(c, plan, ws); }, 3, quick ? 5 : 20);
        std::string name = with_sel ? "select25" : "full";
        if (with_pos) name += "+positions";
        if (with_mass) name += "+key_mass";
        rows.push_back({"decode", name, batch, ctx, hq, hkv, d, page, with_sel ? 0.25 : 1.0,
                        with_mass, plan.num_splits, ms, double(batch) * hkv * keys * kv_bytes_per_key, 0});
        std::printf("%s\n", csv_line(rows.back()).c_str());
      }
    }
  }
}

void bench_prefill(std::vector<Row>& rows, bool quick) {
  using T = __nv_bfloat16;
  const int len = quick ? 4096 : 16384, hq = 32, hkv = 8, page = 16;
  for (int d : {128, 64}) {
    const int num_pages = (len + page - 1) / page;
    DeviceBuffer<T> k(size_t(num_pages) * hkv * page * d), v(k.size()), q(size_t(len) * hq * d);
    fill(k, 4);
    fill(v, 5);
    fill(q, 6);
    std::vector<int32_t> indices(num_pages);
    std::iota(indices.begin(), indices.end(), 0);
    DeviceBuffer<int32_t> dindptr(std::vector<int32_t>{0, num_pages}), dindices(indices),
        dlast(std::vector<int32_t>{len - (num_pages - 1) * page}), dqo(std::vector<int32_t>{0, len});
    DeviceBuffer<float> out(size_t(len) * hq * d), lse(size_t(len) * hq);
    PrefillParams<T> p;
    p.kv = {page, hkv, d, k.data(), v.data(), dindptr.data(), dindices.data(), dlast.data()};
    p.q = q.data();
    p.qo_indptr = dqo.data();
    p.batch = 1;
    p.num_qo_heads = hq;
    p.max_rows = len;
    p.scale = 1.f / std::sqrt(float(d));
    p.out = out.data();
    p.lse = lse.data();
    // Positions as the device store keeps them (slot order, no holes).
    std::vector<int32_t> pos_host(size_t(num_pages) * hkv * page, -1);
    for (int pi = 0; pi < num_pages; ++pi)
      for (int h = 0; h < hkv; ++h)
        for (int e = 0; e < page && pi * page + e < len; ++e)
          pos_host[(size_t(pi) * hkv + h) * page + e] = pi * page + e;
    DeviceBuffer<int32_t> dpos(pos_host);
    for (int variant = 0; variant < 3; ++variant) {
      const bool windowed = variant == 1;
      PrefillParams<T> c = p;
      if (variant == 2) c.kv_pos = dpos.data();
      double pairs = double(len) * (len + 1) / 2;
      if (windowed) {
        const int w = 4096, s = 4;
        c.mask = WindowSinkMask{w, s, false};
        pairs = 0;
        for (int i = 0; i < len; ++i) pairs += std::min(i + 1, w) + std::min(std::max(i + 1 - w, 0), s);
      }
      const double ms = median_ms([&] { prefill_attention<T>(c); }, 2, quick ? 3 : 10);
      rows.push_back({"prefill", variant == 0 ? "causal" : variant == 1 ? "window4096+sinks4" : "causal+positions", 1, len, hq, hkv, d, page,
                      1.0, 0, 1, ms, 0, 4.0 * hq * d * pairs});
      std::printf("%s\n", csv_line(rows.back()).c_str());
    }
  }
}

}  // namespace
}  // namespace kvlab::cuda

int main(int argc, char** argv) {
  std::string csv_path;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--csv") == 0 && i + 1 < argc) {
      csv_path = argv[++i];
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else {
      std::fprintf(stderr, "usage: %s [--csv PATH] [--quick]\n", argv[0]);
      return 2;
    }
  }
  const std::string why = kvlab::cuda::no_device_reason();
  if (!why.empty()) {
    std::fprintf(stderr, "kvlab_cuda_bench: %s; nothing to measure\n", why.c_str());
    return 0;
  }
  try {
    cudaDeviceProp prop{};
    KVLAB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("# device: %s, %d SMs\n%s\n", prop.name, prop.multiProcessorCount,
                kvlab::cuda::csv_header().c_str());
    std::vector<kvlab::cuda::Row> rows;
    kvlab::cuda::bench_decode(rows, quick);
    kvlab::cuda::bench_prefill(rows, quick);
    if (!csv_path.empty()) {
      std::ofstream f(csv_path);
      f << kvlab::cuda::csv_header() << "\n";
      for (const auto& r : rows) f << kvlab::cuda::csv_line(r) << "\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvlab_cuda_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
