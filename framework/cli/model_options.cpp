#include "framework/cli/model_options.h"

#include "framework/core/error.h"
#include "framework/engine/device.h"
#include "framework/model/model_registry.h"

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
       "cuda: bf16 | f32 (weights, KV pages and GEMM inputs on the GPU)");
}

void apply_device_options(const po::variables_map& vm, EngineOptions& opts) {
  opts.device = parse_device(vm["device"].as<std::string>(), "--device");
  opts.device_dtype = parse_device_dtype(vm["device-dtype"].as<std::string>(), "--device-dtype");
}

std::unique_ptr<Model> load_model_from_options(const po::variables_map& vm) {
  LoadOptions lo;
  lo.weight_dtype = vm["weight-dtype"].as<std::string>();
  lo.require_tokenizer = true;
  if (vm.count("tokenizer")) lo.tokenizer_path = vm["tokenizer"].as<std::string>();
  return load_model(resolve_model_path(vm["model"].as<std::string>(), "--model"), lo);
}

}  // namespace kvlab::cli
