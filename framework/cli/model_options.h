// The model options shared by the commands that run a model (generate, perplexity):
// --model, --tokenizer, --weight-dtype, --threads, --device, --device-dtype; and loading the
// model they name.
#pragma once

#include <memory>

#include "framework/cli/options.h"
#include "framework/engine/engine.h"
#include "framework/model/model.h"

namespace kvlab::cli {

void add_model_options(po::options_description& desc);

// Loads --model (with --tokenizer / --weight-dtype); the model must carry or be given a
// tokenizer. Throws kvlab::Error naming the file on bad input.
std::unique_ptr<Model> load_model_from_options(const po::variables_map& vm);

// --device / --device-dtype / --kv-format / --kv-fp8-scale into the engine options (Error for an
// unknown value, or a KV format the device backend lacks).
void apply_device_options(const po::variables_map& vm, EngineOptions& opts);

}  // namespace kvlab::cli
