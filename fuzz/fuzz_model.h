// What the model-file targets (fuzz_hf, fuzz_llama2c) run on their files: the loader without the
// tokenizer, then what is derived from the loaded config. kvlab::Error is an accepted outcome.
#pragma once

#include <filesystem>
#include <memory>

#include "framework/core/error.h"
#include "framework/model/model.h"

namespace kvlab::fuzz {

inline void load_model_without_tokenizer(const std::filesystem::path& path) {
  try {
    LoadOptions opts;
    opts.load_tokenizer = false;
    const std::unique_ptr<Model> model = load_model(path, opts);
    (void)parameter_count(*model);
    (void)rope_inv_freq(model->config);
  } catch (const Error&) {
  }
}

}  // namespace kvlab::fuzz
