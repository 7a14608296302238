// kvlab perplexity --model PATH --text FILE: perplexity of a text file under one of the three
// protocols of evals/perplexity.h (POLICIES.md section 8). The whole file is tokenized with BOS
// first when the tokenizer adds one by default (e.g. GGUF tokenizer.ggml.add_bos_token), as
// llama.cpp does.
//   --protocol chunked (default; llama.cpp): cut into non-overlapping windows of --ctx tokens (the
//       text must hold at least 2 windows), each window's first token replaced by BOS (only when
//       BOS is added, as llama.cpp) and fed to a fresh sequence in one prefill with all logits,
//       only the second half of each window scored (positions N/2+1 .. N-1);
//   --protocol streaming (StreamingLLM): one sequence, every token through the decode path with
//       the policy active (--tokens of the text, default the model's context);
//   --protocol sliding (Hugging Face): windows of --window tokens every --stride tokens.
// Prints PPL = exp(mean NLL) with its standard error (delta method, as llama.cpp). --nll-out
// FILE writes one line per scored token: position, token id, NLL.
#include <chrono>
#include <cstdio>
#include <unistd.h>
#include <fstream>
#include <optional>
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

int run_perplexity(const std::vector<std::string>& args) {
  po::options_description desc("options");
  desc.add_options()
      ("text", po::value<std::string>()->required(), "UTF-8 text file to score")
      ("protocol", po::value<std::string>()->default_value("chunked"),
       "chunked (llama.cpp windows of --ctx) | streaming (one sequence, every token decoded with the "
       "policy) | sliding (windows of --window every --stride)")
      ("ctx", po::value<int>()->default_value(512), "chunked: window length N in tokens (the text needs >= 2N)")
      ("max-windows", po::value<int>()->default_value(0), "chunked: score at most this many windows; 0 = all")
      ("window", po::value<int>()->default_value(1024), "sliding: window length in tokens")
      ("stride", po::value<int>()->default_value(512), "sliding: stride in tokens")
      ("tokens", po::value<int64_t>()->default_value(0),
       "streaming, sliding: tokens taken from the start of the text (BOS included); 0 = streaming: the "
       "model's context, sliding: all")
      ("nll-out", po::value<std::string>(), "write 'position token nll' per scored token to this file");
  add_model_options(desc);
  add_policy_options(desc);
  po::variables_map vm;
  if (!parse_options(args, "kvlab perplexity --model PATH --text FILE [--protocol chunked|streaming|sliding] [--ctx N] [options]",
                     desc, {}, vm))
    return 0;
  const std::string protocol_name = vm["protocol"].as<std::string>();
  const std::optional<PplProtocol> named = enum_from_name(kPplProtocolNames, protocol_name);
  if (!named) fail("--protocol: expected chunked, streaming or sliding, got '", protocol_name, "'");
  const PplProtocol protocol = *named;
  const int n_ctx = vm["ctx"].as<int>();
  if (n_ctx < 4) fail("--ctx must be >= 4, got ", n_ctx);
  const int window = vm["window"].as<int>(), stride = vm["stride"].as<int>();
  if (protocol == PplProtocol::kSliding && (window < 2 || stride < 1 || stride > window))
    fail("--window must be >= 2 and --stride in 1..window, got --window ", window, " --stride ", stride);
  const int64_t max_tokens = vm["tokens"].as<int64_t>();
  if (max_tokens < 0) fail("--tokens must be >= 0, got ", max_tokens);
  const int max_windows = vm["max-windows"].as<int>();
  const std::string text_path = vm["text"].as<std::string>();
  const std::string text = read_input_file(text_path, "text file");

  const std::unique_ptr<Model> model = load_model_from_options(vm);
  const ModelConfig& c = model->config;
  if (protocol == PplProtocol::kChunked && n_ctx > c.max_seq_len)
    fail("--ctx ", n_ctx, " is longer than the model's context of ", c.max_seq_len, " tokens");
  if (protocol == PplProtocol::kSliding && window > c.max_seq_len)
    fail("--window ", window, " is longer than the model's context of ", c.max_seq_len, " tokens");
  const Tokenizer& tok = model->require_tokenizer();
  const bool add_bos = tok.add_bos_by_default();
  if (add_bos && tok.bos_id() < 0) fail("the tokenizer adds BOS by default but has no BOS token");

  EncodeOptions eo;
  eo.add_bos = add_bos;
  std::vector<int32_t> tokens = tok.encode(text, eo);
  if (protocol == PplProtocol::kChunked) {
    const size_t windows = tokens.size() / static_cast<size_t>(n_ctx);
    if (windows < 2)
      fail(text_path, ": ", tokens.size(), " tokens; --ctx ", n_ctx, " needs at least ", 2 * n_ctx);
    if (max_windows > 0 && windows > static_cast<size_t>(max_windows))
      tokens.resize(static_cast<size_t>(std::max(max_windows, 2)) * n_ctx);
  } else {
    const int64_t take = max_tokens > 0 ? max_tokens
                         : protocol == PplProtocol::kStreaming ? int64_t(c.max_seq_len)
                                                               : int64_t(tokens.size());
    if (int64_t(tokens.size()) > take) tokens.resize(size_t(take));
    if (tokens.size() < 2) fail(text_path, ": ", tokens.size(), " tokens; at least 2 are needed");
  }

  PolicyRegistry registry = make_builtin_registry();
  PolicyMaker maker = make_policy_maker_from_options(vm, registry, policy_shape(c));
  EngineOptions opts;
  opts.threads = vm["threads"].as<int>();
  apply_device_options(vm, opts);
  opts.prefill_chunk_tokens = std::max(opts.prefill_chunk_tokens, 1);
  // Streaming past the model's context (a window or sinks policy keeps the cache bounded).
  if (protocol == PplProtocol::kStreaming && int64_t(tokens.size()) > c.max_seq_len) opts.max_tokens = int64_t(tokens.size());
  Engine engine(*model, opts);
  EngineLm lm(engine, std::move(maker));

  PerplexityOptions po_;
  po_.protocol = protocol;
  po_.n_ctx = n_ctx;
  po_.window = window;
  po_.stride = stride;
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
  const std::string how =
      protocol == PplProtocol::kChunked   ? str_cat(" in ", tokens.size() / static_cast<size_t>(n_ctx), " windows of ", n_ctx)
      : protocol == PplProtocol::kSliding ? str_cat(", sliding windows of ", window, ", stride ", stride)
                                          : std::string(", streaming");
  std::printf("PPL = %.4f +/- %.4f  (%zu scored tokens%s, text %s, %zu tokens%s, tokenizer %s)%s%s\n", r.ppl,
              r.ppl_stderr, r.nll.size(), how.c_str(), text_path.c_str(), tokens.size(),
              add_bos ? " with BOS" : ", no BOS", tok.kind().c_str(), r.stopped.empty() ? "" : "; stopped early: ",
              r.stopped.c_str());
  return 0;
}

}  // namespace kvlab::cli
