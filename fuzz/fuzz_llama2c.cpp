// llama2.c checkpoints (legacy v0 and the version 1 "ak42" export): the input is one model.bin.
#include "framework/core/error.h"
#include "framework/model/model.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvlab;
  const std::filesystem::path path = fuzz::case_dir() / "model.bin";
  fuzz::write_file(path, {reinterpret_cast<const char*>(data), size});
  try {
    LoadOptions opts;
    opts.load_tokenizer = false;
    const std::unique_ptr<Model> model = load_model(path, opts);
    (void)parameter_count(*model);
    (void)rope_inv_freq(model->config);
  } catch (const Error&) {
  }
  return 0;
}
