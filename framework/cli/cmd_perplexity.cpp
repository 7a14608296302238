// kvlab perplexity --model PATH --text FILE --ctx N: perplexity by the llama.cpp protocol
// (POLICIES.md section 8, evals/perplexity.h "chunked"): the whole file is tokenized (with BOS
// first when the tokenizer adds one by default, e.g. GGUF tokenizer.ggml.add_bos_token, as
// llama.cpp), cut into non-overlapping windows of N tokens (the text must hold at least 2N),
// each window's first token replaced by BOS (only when BOS is added, as llama.cpp) and fed to a
// fresh sequence in one prefill with all logits, and only the second half of each window scored
// (positions N/2+1 .. N-1). Prints PPL = exp(mean NLL) with its standard error (delta method,
// as llama.cpp). --nll-out FILE writes one line per scored token: position, token id, NLL.
#include <chrono>
#include <cstdio>
#include <unistd.h>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "evals/lm.h"
#include "evals/perplexity.h"
#include "framework/cli/model_options.h"
#include "framework/cli/options.h"
#include "framework/core/error.h"
#include "framework/engine/engine.h"
#include "framework/experiment/engine_lm.h"
#include "framework/model/model.h"
#include "framework/cli/cli_policy.h"
#include "framework/tokenizer/tokenizer.h"
#include "policies/builtin.h"

namespace kvlab::cli {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open the text file");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

int run_perplexity(const std::vector<std::string>& args) {
  po::options_description desc("options");
  desc.add_options()
      ("text", po::value<std::string>()->required(), "UTF-8 text file to score")
      ("ctx", po::value<int>()->default_value(512), "window length N in tokens (the text needs >= 2N)")
      ("max-windows", po::value<int>()->default_value(0), "score at most this many windows; 0 = all")
      ("nll-out", po::value<std::string>(), "write 'position token nll' per scored token to this file");
  add_model_options(desc);
  add_policy_options(desc);
  po::positional_options_description pos;
  po::variables_map vm;
  if (!parse_options(args, "kvlab perplexity --model PATH --text FILE --ctx N [options]", desc, pos, vm))
    return 0;
  const int n_ctx = vm["ctx"].as<int>();
  if (n_ctx < 4) fail("--ctx must be >= 4, got ", n_ctx);
  const int max_windows = vm["max-windows"].as<int>();
  const std::string text_path = vm["text"].as<std::string>();
  const std::string text = read_file(text_path);

  const std::unique_ptr<Model> model = load_model_from_options(vm);
  const ModelConfig& c = model->config;
  if (n_ctx > c.max_seq_len)
    fail("--ctx ", n_ctx, " is longer than the model's context of ", c.max_seq_len, " tokens");
  const Tokenizer& tok = model->require_tokenizer();
  const bool add_bos = tok.add_bos_by_default();
  if (add_bos && tok.bos_id() < 0) fail("the tokenizer adds BOS by default but has no BOS token");

  EncodeOptions eo;
  eo.add_bos = add_bos;
  std::vector<int32_t> tokens = tok.encode(text, eo);
  const size_t windows = tokens.size() / static_cast<size_t>(n_ctx);
  if (windows < 2)
    fail(text_path, ": ", tokens.size(), " tokens; --ctx ", n_ctx, " needs at least ", 2 * n_ctx);
  if (max_windows > 0 && windows > static_cast<size_t>(max_windows))
    tokens.resize(static_cast<size_t>(std::max(max_windows, 2)) * n_ctx);

  PolicyRegistry registry = make_builtin_registry();
  PolicyMaker maker = make_policy_maker_from_options(vm, registry, policy_shape(c));
  EngineOptions opts;
  opts.threads = vm["threads"].as<int>();
  apply_device_options(vm, opts);
  opts.prefill_chunk_tokens = std::max(opts.prefill_chunk_tokens, 1);
  Engine engine(*model, opts);
  EngineLm lm(engine, std::move(maker));

  PerplexityOptions po_;
  po_.protocol = PplProtocol::kChunked;
  po_.n_ctx = n_ctx;
  const auto t0 = std::chrono::steady_clock::now();
  // On a terminal the progress line is redrawn; in a log, one line every ~10% of the text.
  const bool tty = isatty(fileno(stderr));
  int64_t next_report = 0;
  po_.on_progress = [&](int64_t fed) {
    if (!tty && fed < next_report) return;
    next_report = fed + static_cast<int64_t>(tokens.size() / 10) + 1;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, tty ? "\r[%lld / %zu tokens, %.0f tok/s]" : "[%lld / %zu tokens, %.0f tok/s]\n",
                 static_cast<long long>(fed), tokens.size(), fed / std::max(s, 1e-9));
  };
  const PerplexityResult r = evaluate_perplexity(lm, tokens, add_bos ? tok.bos_id() : -1, po_);
  if (tty) std::fprintf(stderr, "\n");
  if (vm.count("nll-out")) {
    const std::string out_path = vm["nll-out"].as<std::string>();
    std::FILE* f = std::fopen(out_path.c_str(), "w");
    if (f == nullptr) fail(out_path, ": cannot write the NLL file");
    for (size_t k = 0; k < r.nll.size(); ++k)
      std::fprintf(f, "%lld %d %.9g\n", static_cast<long long>(r.positions[k]),
                   tokens[static_cast<size_t>(r.positions[k])], static_cast<double>(r.nll[k]));
    if (std::fclose(f) != 0) fail(out_path, ": write failed");
  }
  std::printf("PPL = %.4f +/- %.4f  (%zu scored tokens in %zu windows of %d, text %s, %zu tokens, "
              "tokenizer %s%s)\n",
              r.ppl, r.ppl_stderr, r.nll.size(), tokens.size() / static_cast<size_t>(n_ctx), n_ctx,
              text_path.c_str(), tokens.size(), tok.kind().c_str(), add_bos ? "" : ", no BOS");
  return 0;
}

}  // namespace kvlab::cli
