// Hugging Face tokenizer.json (byte-level BPE): the input is one tokenizer.json, loaded with load_tokenizer() and exercised as in
// fuzz_tokenizer_files.h.
#include "fuzz/fuzz_tokenizer_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return kvlab::fuzz::run_tokenizer_file(data, size, "tokenizer.json");
}
