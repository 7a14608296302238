// kvlab generate --model PATH --prompt TEXT: streams a continuation of the prompt.
//
// The prompt is tokenized with the model's tokenizer (or --tokenizer), with BOS when the
// tokenizer adds one by default, prefilled in one pass, then tokens are sampled one at a time
// (temperature 0 = greedy; else temperature, top-k, top-p with --seed) and printed as soon as
// they complete UTF-8 text. Stops at end-of-sequence (unless --ignore-eos), --max-new-tokens or
// the model's context. Timing goes to stderr: prefill tok/s, generated tokens per second, and
// decode steps (forward passes of one token: generated - 1 when it stops at -n) per second of
// the generation loop. A prompt longer than the context is one clear error (exit 1).
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "framework/cli/model_options.h"
#include "framework/cli/options.h"
#include "framework/core/error.h"
#include "framework/engine/engine.h"
#include "kernels/cpu/sampler.h"
#include "framework/model/model.h"
#include "framework/cli/cli_policy.h"
#include "framework/tokenizer/tokenizer.h"
#include "policies/builtin.h"

namespace kvlab::cli {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

int run_generate(const std::vector<std::string>& args) {
  po::options_description desc("options");
  desc.add_options()
      ("prompt,p", po::value<std::string>()->required(), "the text to continue")
      ("max-new-tokens,n", po::value<int>()->default_value(128), "tokens to generate at most")
      ("temperature", po::value<float>()->default_value(0.8f, "0.8"), "sampling temperature; 0 = greedy")
      ("top-k", po::value<int>()->default_value(40), "keep the k most likely tokens; 0 = all")
      ("top-p", po::value<float>()->default_value(0.95f, "0.95"), "nucleus mass; 1 = all")
      ("seed", po::value<uint64_t>()->default_value(42), "sampling seed")
      ("ignore-eos", po::bool_switch(), "keep generating past end-of-sequence (benchmarks: always -n tokens)");
  add_model_options(desc);
  add_policy_options(desc);
  po::variables_map vm;
  if (!parse_options(args, "kvlab generate --model PATH --prompt TEXT [options]", desc, {}, vm)) return 0;

  const int max_new = vm["max-new-tokens"].as<int>();
  if (max_new < 0) fail("--max-new-tokens must be >= 0, got ", max_new);
  SamplerOptions so;
  so.temperature = vm["temperature"].as<float>();
  so.top_k = vm["top-k"].as<int>();
  so.top_p = vm["top-p"].as<float>();
  so.seed = vm["seed"].as<uint64_t>();
  Sampler sampler(so);  // validates the sampling options before the model loads

  const std::unique_ptr<Model> model = load_model_from_options(vm);
  const Tokenizer& tok = model->require_tokenizer();
  const ModelConfig& c = model->config;

  EncodeOptions eo;
  eo.add_bos = tok.add_bos_by_default();
  const std::vector<int32_t> prompt = tok.encode(vm["prompt"].as<std::string>(), eo);
  if (prompt.empty()) fail("the prompt encodes to no tokens");
  if (static_cast<int64_t>(prompt.size()) > c.max_seq_len)
    fail("the prompt is ", prompt.size(), " tokens, longer than the model's context of ", c.max_seq_len,
         " tokens");

  PolicyRegistry registry = make_builtin_registry();
  auto policy = make_policy_from_options(vm, registry, policy_shape(c));
  EngineOptions opts;
  opts.threads = vm["threads"].as<int>();
  apply_device_options(vm, opts);
  Engine engine(*model, opts);
  const SeqId seq = engine.start_sequence(std::move(policy));

  std::vector<float> logits;
  const auto t0 = Clock::now();
  const StepStatus st = engine.prefill(seq, prompt, logits, false, /*prompt_end=*/true);
  if (st != StepStatus::kOk) fail("prefill of the ", prompt.size(), "-token prompt failed: ", step_status_name(st));
  const double prefill_s = since(t0);

  StreamDecoder stream(tok);
  const auto t1 = Clock::now();
  int generated = 0, decode_steps = 0;
  const bool ignore_eos = vm["ignore-eos"].as<bool>();
  std::string stop = "max-new-tokens";
  while (generated < max_new) {
    const int32_t next = sampler.sample(logits);
    if (next == tok.eos_id() && !ignore_eos) {
      stop = "end of sequence";
      break;
    }
    ++generated;
    std::fputs(stream.push(next).c_str(), stdout);
    std::fflush(stdout);
    if (generated == max_new) break;
    const StepStatus ds = engine.decode(std::span(&seq, 1), std::span(&next, 1), logits);
    ++decode_steps;
    if (ds != StepStatus::kOk) {
      stop = step_status_name(ds);
      break;
    }
  }
  std::fputs(stream.flush().c_str(), stdout);
  std::fputs("\n", stdout);
  std::fflush(stdout);
  const double decode_s = since(t1);
  // "decode": forward steps per second of the whole loop (sampling, detokenising and printing
  // included), the figure to set beside llama-bench's tg (which times its forward steps only).
  std::fprintf(stderr,
               "[prompt %zu tokens, %.1f tok/s | generated %d tokens, %.1f tok/s | decode %d steps, %.1f tok/s | "
               "stop: %s | threads %d]\n",
               prompt.size(), prompt.size() / std::max(prefill_s, 1e-9), generated,
               generated / std::max(decode_s, 1e-9), decode_steps, decode_steps / std::max(decode_s, 1e-9),
               stop.c_str(), engine.threads());
  return 0;
}

}  // namespace kvlab::cli
