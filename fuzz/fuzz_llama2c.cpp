// llama2.c checkpoints (legacy v0 and the version 1 "ak42" export): the input is one model.bin.
#include "fuzz/fuzz_model.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvlab;
  const std::filesystem::path path = fuzz::case_dir() / "model.bin";
  fuzz::write_file(path, {reinterpret_cast<const char*>(data), size});
  fuzz::load_model_without_tokenizer(path);
  return 0;
}
