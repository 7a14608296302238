// Hugging Face directory: the input is up to three files separated by fuzz::kPartSeparator:
//   config.json, then a safetensors file, then (optional) model.safetensors.index.json.
// Without the third part the safetensors file is model.safetensors; with it, the single shard
// model-00001-of-00001.safetensors that an index usually names. The safetensors header is also
// read on its own.
#include "framework/core/error.h"
#include "framework/model/safetensors.h"
#include "fuzz/fuzz_model.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvlab;
  const std::vector<std::string_view> parts = fuzz::split_parts(data, size, 3);
  const std::filesystem::path dir = fuzz::case_dir();
  fuzz::write_file(dir / "config.json", parts[0]);
  std::filesystem::path weights = dir / "model.safetensors";
  if (parts.size() == 3) {
    weights = dir / "model-00001-of-00001.safetensors";
    fuzz::write_file(dir / "model.safetensors.index.json", parts[2]);
  }
  fuzz::write_file(weights, parts.size() > 1 ? parts[1] : std::string_view());
  try {
    const SafetensorsFile file = SafetensorsFile::open(weights);
    (void)file.tensors().size();
  } catch (const Error&) {
  }
  fuzz::load_model_without_tokenizer(dir);
  return 0;
}
