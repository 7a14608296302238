// kvlab_bench_engine: decode and prefill speed and peak memory of the engine on random-weight
// models built in memory, against this machine's memory read bandwidth and sgemm GFLOP/s
// measured in the same run (MACHINE.md: compare ratios, never absolute times across runs).
//
//   kvlab_bench_engine [--configs 110m,15m] [--dtypes f32,f16,bf16,q8_0] [--threads 1,2]
//                      [--decode-tokens 64] [--prompt-tokens 16] [--prefill-tokens 512]
//
// Each case runs in its own child process (fork before any thread exists), which first measures
// the read bandwidth (1 GiB float sum) and sgemm GFLOP/s with the case's thread count (the
// machine is shared: its speed drifts between cases), then resets the peak-RSS counter
// (/proc/self/clear_refs) and builds the model. Figures per case:
//   decode tok/s and the bytes it streams per token: every weight matrix once (+ the embedding
//     row) + the K and V rows attention reads (context x kv_bytes_per_token); as GB/s and as a
//     fraction of the measured read bandwidth with the same thread count;
//   prefill of P tokens in one pass: GFLOP/s counting 2 x P x (matrix params, LM head for the
//     last token only) + causal attention (2 x 2 x P(P+1)/2 x head_dim x heads x layers), as a
//     fraction of the measured sgemm GFLOP/s with the same thread count;
//   peak RSS vs weights + KV in use (and the process's RSS before the model was built).
#include <cblas.h>
#include <immintrin.h>
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "framework/engine/engine.h"
#include "kernels/cpu/linear.h"
#include "framework/engine/random_model.h"

namespace kvlab {
namespace {

using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

double rss_now_mb() {  // VmRSS from /proc/self/status
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::atof(line.c_str() + 6) / 1024.0;
  return 0;
}
double rss_peak_mb() {  // VmHWM: the peak since the last reset_rss_peak()
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::atof(line.c_str() + 6) / 1024.0;
  return 0;
}
void reset_rss_peak() {  // Linux: writing 5 to clear_refs resets VmHWM to the current RSS
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
}

// Sum of n floats (n a multiple of 64, a 32-byte aligned) with 8 AVX accumulators: a stream of
// loads fast enough to measure read bandwidth. Target attribute: needs AVX2 at run time
// whatever KVLAB_NATIVE says (every machine kvlab is measured on has it).
__attribute__((target("avx2"))) float sum_avx(const float* a, size_t n) {
  __m256 acc[8];
  for (auto& x : acc) x = _mm256_setzero_ps();
  for (size_t i = 0; i < n; i += 64)
    for (int k = 0; k < 8; ++k) acc[k] = _mm256_add_ps(acc[k], _mm256_load_ps(a + i + 8 * k));
  for (int k = 1; k < 8; ++k) acc[0] = _mm256_add_ps(acc[0], acc[k]);
  alignas(32) float l[8];
  _mm256_store_ps(l, acc[0]);
  float total = 0;
  for (float v : l) total += v;
  return total;
}

// Read bandwidth: sum of a 1 GiB float array with 8 accumulators per thread, best of 3.
double measure_read_bandwidth_gbs(int threads) {
  const size_t n = (size_t{1} << 30) / sizeof(float);
  float* a = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
#pragma omp parallel for num_threads(threads) schedule(static)
  for (size_t i = 0; i < n; ++i) a[i] = 1.f;
  double best = 0;
  volatile float sink = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      const size_t b = n / 64 * t / nt * 64, e = n / 64 * (t + 1) / nt * 64;
      total += sum_avx(a + b, e - b);
    }
    sink = total;
    best = std::max(best, n * sizeof(float) / seconds(t0, Clock::now()) / 1e9);
  }
  (void)sink;
  std::free(a);
  return best;
}

// OpenBLAS sgemm GFLOP/s at m = n = k = 1536 with `threads` BLAS threads, best of 3.
double measure_sgemm_gflops(int threads) {
  const int n = 1536;
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n);
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = Clock::now();
    sgemm_xwt(a.data(), n, b.data(), n, n, c.data(), n, threads);
    const double s = seconds(t0, Clock::now());
    if (rep > 0) best = std::max(best, 2.0 * n * n * n / s / 1e9);
  }
  sgemm_xwt(a.data(), 1, b.data(), 1, n, c.data(), n, 1);  // back to single-threaded BLAS
  return best;
}

size_t matrix_bytes(const WeightView& w) { return w.row_bytes() * static_cast<size_t>(w.rows); }

size_t weight_bytes(const Model& m) {
  size_t total = matrix_bytes(m.tok_embeddings);
  if (m.lm_head.data != m.tok_embeddings.data) total += matrix_bytes(m.lm_head);
  for (const auto& l : m.layers)
    total += matrix_bytes(l.wq) + matrix_bytes(l.wk) + matrix_bytes(l.wv) + matrix_bytes(l.wo) +
             matrix_bytes(l.w_gate) + matrix_bytes(l.w_up) + matrix_bytes(l.w_down) +
             4 * (l.attn_norm.size() + l.ffn_norm.size());
  return total;
}

// Bytes one decode step streams, apart from K/V: every layer matrix, the LM head, one embedding row.
size_t decode_weight_bytes(const Model& m) {
  size_t total = matrix_bytes(m.lm_head) + m.tok_embeddings.row_bytes();
  for (const auto& l : m.layers)
    total += matrix_bytes(l.wq) + matrix_bytes(l.wk) + matrix_bytes(l.wv) + matrix_bytes(l.wo) +
             matrix_bytes(l.w_gate) + matrix_bytes(l.w_up) + matrix_bytes(l.w_down);
  return total;
}

double prefill_flops(const ModelConfig& c, int64_t p) {
  const double qd = double(c.n_heads) * c.head_dim, kvd = double(c.n_kv_heads) * c.head_dim;
  const double per_token_params =
      c.n_layers * (c.dim * (qd + 2 * kvd) + qd * c.dim + 3.0 * c.dim * c.hidden_dim);
  const double attn = 2.0 * 2.0 * double(p) * double(p + 1) / 2 * c.head_dim * c.n_heads * c.n_layers;
  return 2.0 * p * per_token_params + 2.0 * c.vocab_size * c.dim + attn;
}

struct Args {
  std::vector<std::string> configs = {"110m", "15m"};
  std::vector<std::string> dtypes = {"f32", "f16", "bf16", "q8_0"};
  std::vector<int> threads = {1, 2};
  int decode_tokens = 64, prompt_tokens = 16, prefill_tokens = 512;
};

void run_case(const std::string& cfg_name, const std::string& dtype_name, int threads, const Args& args) {
  // The machine is shared and its speed drifts: measure bandwidth and sgemm right before the case.
  const double bw_gbs = measure_read_bandwidth_gbs(threads);
  const double sgemm_gflops = measure_sgemm_gflops(threads);
  reset_rss_peak();
  const double rss_base = rss_now_mb();
  const ModelConfig cfg = cfg_name == "110m" ? config_110m() : config_15m();
  auto model = make_random_model(cfg, parse_dtype(dtype_name), 1234);
  EngineOptions o;
  o.threads = threads;
  o.prefill_chunk_tokens = args.prefill_tokens;
  Engine engine(*model, o);
  std::vector<int32_t> prompt(args.prompt_tokens);
  for (int i = 0; i < args.prompt_tokens; ++i) prompt[i] = (i * 7919 + 13) % cfg.vocab_size;
  std::vector<float> logits;

  // decode
  SeqId s = engine.start_sequence();
  if (engine.prefill(s, prompt, logits) != StepStatus::kOk) fail("bench: prefill failed");
  int32_t tok = 1;
  for (int i = 0; i < 4; ++i)  // warm-up
    engine.decode(std::span(&s, 1), std::span(&tok, 1), logits);
  const int64_t ctx0 = engine.n_tokens(s);
  const auto t0 = Clock::now();
  for (int i = 0; i < args.decode_tokens; ++i) {
    tok = (tok * 31 + 7) % cfg.vocab_size;
    if (engine.decode(std::span(&s, 1), std::span(&tok, 1), logits) != StepStatus::kOk) fail("bench: decode failed");
  }
  const double dec_s = seconds(t0, Clock::now());
  const double tok_s = args.decode_tokens / dec_s;
  const double kv_read = double(cfg.kv_bytes_per_token(DType::kF32)) *
                         (ctx0 + 1 + ctx0 + args.decode_tokens) / 2.0;  // mean context per step
  const double bytes_per_tok = double(decode_weight_bytes(*model)) + kv_read;
  const double dec_gbs = bytes_per_tok * tok_s / 1e9;
  const size_t kv_peak_decode = engine.sequence_stats(s).kv_bytes_peak;
  engine.end_sequence(s);

  // prefill of P tokens in one pass (best of 2)
  std::vector<int32_t> long_prompt(args.prefill_tokens);
  for (int i = 0; i < args.prefill_tokens; ++i) long_prompt[i] = (i * 104729 + 1) % cfg.vocab_size;
  double pre_s = 1e30;
  size_t kv_peak_prefill = 0;
  for (int rep = 0; rep < 2; ++rep) {
    SeqId p = engine.start_sequence();
    const auto a = Clock::now();
    if (engine.prefill(p, long_prompt, logits) != StepStatus::kOk) fail("bench: long prefill failed");
    pre_s = std::min(pre_s, seconds(a, Clock::now()));
    kv_peak_prefill = std::max(kv_peak_prefill, engine.sequence_stats(p).kv_bytes_peak);
    engine.end_sequence(p);
  }
  const double pre_gflops = prefill_flops(cfg, args.prefill_tokens) / pre_s / 1e9;

  const double w_mb = weight_bytes(*model) / 1048576.0;
  const double kv_mb = std::max(kv_peak_decode, kv_peak_prefill) / 1048576.0;
  const double peak = rss_peak_mb();
  std::printf(
      "case config=%s dtype=%s threads=%d read_bw_GBs=%.2f sgemm_GFLOPs=%.1f | decode tok/s=%.1f GB/s=%.2f frac_of_bw=%.3f | "
      "prefill%d tok/s=%.0f GFLOP/s=%.1f frac_of_sgemm=%.3f | weights_MB=%.1f kv_MB=%.1f "
      "peak_rss_MB=%.1f base_rss_MB=%.1f rss/(w+kv)=%.3f (peak-base)/(w+kv)=%.3f\n",
      cfg_name.c_str(), dtype_name.c_str(), threads, bw_gbs, sgemm_gflops, tok_s, dec_gbs, dec_gbs / bw_gbs, args.prefill_tokens,
      args.prefill_tokens / pre_s, pre_gflops, pre_gflops / sgemm_gflops, w_mb, kv_mb, peak, rss_base,
      peak / (w_mb + kv_mb), (peak - rss_base) / (w_mb + kv_mb));
  std::fflush(stdout);
}

// Runs fn in a child process; returns its exit status.
template <class Fn>
int in_child(Fn fn) {
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    int rc = 0;
    try {
      fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kvlab_bench_engine: %s\n", e.what());
      rc = 1;
    }
    std::fflush(stdout);
    _exit(rc);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

}  // namespace
}  // namespace kvlab

int main(int argc, char** argv) {
  using namespace kvlab;
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kvlab_bench_engine: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--configs") args.configs = split_list(next());
    else if (a == "--dtypes") args.dtypes = split_list(next());
    else if (a == "--threads") {
      args.threads.clear();
      for (const auto& t : split_list(next())) args.threads.push_back(std::atoi(t.c_str()));
    } else if (a == "--decode-tokens") args.decode_tokens = std::atoi(next().c_str());
    else if (a == "--prompt-tokens") args.prompt_tokens = std::atoi(next().c_str());
    else if (a == "--prefill-tokens") args.prefill_tokens = std::atoi(next().c_str());
    else {
      std::fprintf(stderr,
                   "usage: kvlab_bench_engine [--configs 110m,15m] [--dtypes f32,f16,bf16,q8_0] "
                   "[--threads 1,2] [--decode-tokens N] [--prompt-tokens N] [--prefill-tokens N]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  int failures = 0;
  for (const auto& cfg : args.configs)
    for (const auto& dt : args.dtypes)
      for (size_t k = 0; k < args.threads.size(); ++k)
        failures += in_child([&] { run_case(cfg, dt, args.threads[k], args); }) != 0;
  return failures ? 1 : 0;
}
