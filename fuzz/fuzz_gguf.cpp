// GGUF reader and model loader: the input is one .gguf file. Reads every metadata value, then
// loads it as a model (weights as stored, the tokenizer from its tokenizer.ggml.* metadata) and
// runs the tokenizer once.
#include "framework/core/error.h"
#include "framework/model/gguf.h"
#include "framework/model/model.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvlab;
  const std::filesystem::path path = fuzz::case_dir() / "model.gguf";
  fuzz::write_file(path, {reinterpret_cast<const char*>(data), size});
  try {
    const GgufFile file = GgufFile::open(path);
    for (const GgufValue& v : file.metadata()) (void)v.to_string();
  } catch (const Error&) {
  }
  try {
    const std::unique_ptr<Model> model = load_model(path);
    (void)parameter_count(*model);
    if (model->tokenizer) {
      const std::vector<int32_t> ids = model->tokenizer->encode("Hello, world! 123 \xE2\x96\x81x");
      (void)model->tokenizer->decode(ids);
    }
  } catch (const Error&) {
  }
  return 0;
}
