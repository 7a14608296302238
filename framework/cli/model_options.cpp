#include "framework/cli/model_options.h"

#include "framework/core/error.h"
#include "framework/engine/device.h"
#include "framework/model/model_registry.h"

#include <cmath>
#include <cstdlib>
#include <string>

namespace kvlab::cli {

void add_model_options(po::options_description& desc) {
  desc.add_options()
      ("model,m", po::value<std::string>()->required(), "*.gguf | Hugging Face directory | llama2.c *.bin | a registered name (kvlab models)")
      ("threads", po::value<int>()->default_value(0), "threads; 0 = all cores")
      ("tokenizer,t", po::value<std::string>(), "tokenizer file to use instead of the model's own")
      ("weight-dtype", po::value<std::string>()->default_value("keep"),
       "convert weights on load: keep | f32 | f16 | bf16 | q8_0 | q4_0 | q4_1 | q5_0 | q5_1 | q4_k | q5_k | q6_k")
      ("device", po::value<std::string>()->default_value("cpu"),
       "cpu | cuda (dense layers and attention on the GPU) | emulated (the GPU path on CPU loops, for checking)")
      ("device-dtype", po::value<std::string>()->default_value("bf16"),
       "cuda: bf16 | f32 (weights, KV pages and GEMM inputs on the GPU)")
      ("kv-format", po::value<std::string>()->default_value("f32"),
       "host KV store format: f32 (exact) | bf16 | f16 | int8 | fp8_e4m3 | fp8_e5m2 | int4 | int2 (KIVI; cpu device only)")
      ("kv-fp8-scale", po::value<std::string>()->default_value("1"),
       "fp8 KV formats: the scale of every (layer, KV head), or 'prompt': per sequence, max |x| / the "
       "format's largest value over its first prefill chunk (vLLM's first-pass scales)")
      ("kv-group-size", po::value<int>()->default_value(32), "int4 / int2: KIVI group size G (divides head_dim; divides or is a multiple of the block size 16)")
      ("kv-residual", po::value<int>()->default_value(128), "int4 / int2: the R newest tokens kept fp32 (a multiple of G)");
}

void apply_device_options(const po::variables_map& vm, EngineOptions& opts) {
  opts.device = parse_device(vm["device"].as<std::string>(), "--device");
  opts.device_dtype = parse_device_dtype(vm["device-dtype"].as<std::string>(), "--device-dtype");
  const std::string kv_format = vm["kv-format"].as<std::string>();
  if (!parse_kv_format(kv_format, &opts.kv_format))
    fail("--kv-format: unknown KV format '", kv_format, "' (valid: ", kv_format_names(), ")");
  const std::string fp8_scale = vm["kv-fp8-scale"].as<std::string>();
  if (fp8_scale == "prompt") {
    opts.kv_fp8_scale_from_prompt = true;
  } else {
    char* end = nullptr;
    opts.kv_fp8_scale = std::strtof(fp8_scale.c_str(), &end);
    if (fp8_scale.empty() || *end != '\0' || !(opts.kv_fp8_scale > 0.f && std::isfinite(opts.kv_fp8_scale)))
      fail("--kv-fp8-scale: expected a positive finite number or 'prompt', got '", fp8_scale, "'");
  }
  opts.kv_group_size = vm["kv-group-size"].as<int>();
  opts.kv_residual = vm["kv-residual"].as<int>();
  if (opts.device != Device::kCpu && opts.kv_format != KvFormat::kF32)
    fail("--kv-format ", kv_format, ": the ", device_name(opts.device), " backend takes f32 host KV pages only "
         "(the device pool's precision is --device-dtype)");
}

std::unique_ptr<Model> load_model_from_options(const po::variables_map& vm) {
  LoadOptions lo;
  lo.weight_dtype = vm["weight-dtype"].as<std::string>();
  lo.require_tokenizer = true;
  if (vm.count("tokenizer")) lo.tokenizer_path = vm["tokenizer"].as<std::string>();
  return load_model(resolve_model_path(vm["model"].as<std::string>(), "--model"), lo);
}

}  // namespace kvlab::cli
