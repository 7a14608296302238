// kvlab tokenize: reads all of stdin, encodes it with the given tokenizer and prints the ids
// space-separated on one line (--ids, the default) or one vocabulary piece per line (--pieces).
// With --decode, reads space-separated ids from stdin and prints the decoded text instead.
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "framework/cli/options.h"
#include "framework/core/error.h"
#include "framework/model/model_registry.h"
#include "framework/tokenizer/tokenizer.h"

namespace kvlab::cli {

int run_tokenize(const std::vector<std::string>& args) {
  po::options_description desc("options");
  desc.add_options()
      ("tokenizer,t", po::value<std::string>()->required(),
       "tokenizer.model | tokenizer.json | llama2.c tokenizer.bin | *.gguf | a directory holding one")
      ("ids", "print the token ids, space-separated (default)")
      ("pieces", "print one token per line: id, then the vocabulary's spelling of it")
      ("decode", "read space-separated ids from stdin and print the text they decode to")
      ("bos", "prepend the BOS token (default: never, so the ids are those of the text alone)")
      ("special", "recognise special-token text such as <s> or <|endoftext|>");
  po::variables_map vm;
  if (!parse_options(args, "kvlab tokenize --tokenizer PATH [--ids|--pieces|--decode] < input", desc, {}, vm))
    return 0;
  if (vm.count("pieces") + vm.count("ids") + vm.count("decode") > 1)
    fail("--ids, --pieces and --decode exclude each other (see ", args[0], " --help)");

  const auto tokenizer = load_tokenizer(resolve_model_path(vm["tokenizer"].as<std::string>(), "--tokenizer"));
  std::cin >> std::noskipws;
  const std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());

  if (vm.count("decode")) {
    std::istringstream in(input);
    std::vector<int32_t> ids;
    std::string word;
    while (in >> word) {
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(word, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != word.size() || id < 0 || id >= tokenizer->vocab_size())
        fail("stdin: '", word, "' is not a token id in [0, ", tokenizer->vocab_size(), ")");
      ids.push_back(static_cast<int32_t>(id));
    }
    std::cout << tokenizer->decode(ids);
    return 0;
  }

  EncodeOptions opts;
  opts.add_bos = vm.count("bos") > 0;
  opts.parse_special = vm.count("special") > 0;
  const std::vector<int32_t> ids = tokenizer->encode(input, opts);
  if (vm.count("pieces")) {
    for (const int32_t id : ids) std::cout << id << '\t' << tokenizer->id_to_token(id) << '\n';
  } else {
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
    std::cout << '\n';
  }
  return 0;
}

}  // namespace kvlab::cli
