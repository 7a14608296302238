// kvlab_kept_positions: which text positions one policy keeps, per layer and KV head, right after
// the prompt-end prefill of a given token sequence, on the engine `kvlab run` uses (EngineLm), and
// the greedy answer after it. For comparing kvlab's kept set with a peer's on one sample
// (docs/models/peer.md: tova@0.5, query_agnostic).
//
//   kvlab_kept_positions MODEL IDS_FILE HEAD POLICY [KEY=VALUE ...] [--threads T] [--chunk C]
//                        [--answer-tokens N]
// IDS_FILE: whitespace-separated token ids (a RULER sample's prompt_tokens). The first HEAD ids
// are prefilled with the prompt-end signal (query_agnostic's context; HEAD = all ids is
// query_aware), the rest as a second prefill without it (evals/niah.h feed_prompt), then N greedy
// tokens are decoded (stopping at EOS, as evals/ruler_eval.cpp). --chunk: the prefill chunk
// (engine.prefill_chunk; default 512, experiments/smollm2_peer.yaml's).
// Prints JSON: {"n_layers", "n_kv_heads", "head", "kept": [layer][kv_head][positions...],
// "answer_ids": [...], "runner_up": [[second-best id, best logit - its logit] per answer step],
// "answer": "..."}.
#include <cstdio>
#include <exception>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "evals/lm.h"
#include "evals/perplexity.h"
#include "framework/core/error.h"
#include "framework/core/tool_main.h"
#include "framework/engine/engine.h"
#include "framework/experiment/engine_lm.h"
#include "framework/model/model.h"
#include "framework/policy/params.h"
#include "framework/tokenizer/tokenizer.h"
#include "policies/builtin.h"

namespace kvlab {
namespace {

std::vector<int32_t> read_ids(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(path, ": cannot open the token-id file");
  std::vector<int32_t> ids;
  long long id = 0;
  while (in >> id) ids.push_back(int32_t(id));
  if (!in.eof()) fail(path, ": not a whitespace-separated list of integers (after ", ids.size(), " ids)");
  return ids;
}

void print_json_string(const std::string& s) {
  std::printf("\"");
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') std::printf("\\%c", ch);
    else if (ch < 0x20) std::printf("\\u%04x", ch);
    else std::printf("%c", ch);
  }
  std::printf("\"");
}

int run(int argc, char** argv) {
  if (argc < 5)
    fail("usage: kvlab_kept_positions MODEL IDS_FILE HEAD POLICY [KEY=VALUE ...] [--threads T] [--chunk C] "
         "[--answer-tokens N]");
  const std::string model_path = argv[1], ids_path = argv[2], policy_name = argv[4];
  const long long head = std::stoll(argv[3]);
  std::map<std::string, ParamValue> raw;
  int threads = 1, chunk = 512, answer_tokens = 12;
  for (int i = 5; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> int {
      if (i + 1 >= argc) fail(a, " needs a value");
      return std::stoi(argv[++i]);
    };
    if (a == "--threads") threads = next();
    else if (a == "--chunk") chunk = next();
    else if (a == "--answer-tokens") answer_tokens = next();
    else if (const size_t eq = a.find('='); eq != std::string::npos) raw[a.substr(0, eq)] = parse_param_text(a.substr(eq + 1));
    else fail("unknown argument '", a, "'");
  }
  const std::vector<int32_t> ids = read_ids(ids_path);
  if (head < 1 || head > (long long)ids.size())
    fail("HEAD must be in 1..", ids.size(), " (the ids in ", ids_path, "), got ", head);
  if (chunk < 1 || threads < 1 || answer_tokens < 0) fail("--chunk and --threads must be >= 1, --answer-tokens >= 0");

  const std::unique_ptr<Model> model = load_model(model_path);
  const ModelConfig& c = model->config;
  const Tokenizer& tok = model->require_tokenizer();
  const PolicyRegistry registry = make_builtin_registry();
  // Validates now (an unknown policy or parameter is an error naming it).
  registry.create(policy_name, raw, policy_shape(c), "arguments");
  EngineOptions opts;
  opts.threads = threads;
  opts.prefill_chunk_tokens = chunk;
  Engine engine(*model, opts);
  EngineLm lm(engine, [&]() { return registry.create(policy_name, raw, policy_shape(c), "arguments"); });

  std::vector<std::vector<std::vector<int64_t>>> kept;  // [layer][kv_head] positions, ascending slots
  lm.on_prompt_end = [&](SeqId s) {
    kept.assign(size_t(c.n_layers), std::vector<std::vector<int64_t>>(size_t(c.n_kv_heads)));
    for (int l = 0; l < c.n_layers; ++l) {
      const LayerKv kv = lm.engine().kv().layer(s, l);
      for (int h = 0; h < c.n_kv_heads; ++h)
        for (int slot = 0; slot < kv.n_slots; ++slot)
          if (kv.is_valid(slot, h)) kept[size_t(l)][size_t(h)].push_back(kv.position(slot, h));
    }
  };
  std::vector<int32_t> answer;
  std::vector<std::pair<int32_t, float>> runner_up;  // per answer step: the second-best id, its logit gap
  {
    std::unique_ptr<LmSequence> seq = lm.start(0);
    const std::span<const int32_t> all(ids);
    const std::vector<float>* logits = &seq->prefill(all.first(size_t(head)), false, true);
    if (size_t(head) < ids.size()) logits = &seq->prefill(all.subspan(size_t(head)), false, false);
    for (int t = 0; t < answer_tokens; ++t) {
      const int32_t next = argmax(*logits);
      int32_t second = next == 0 ? 1 : 0;
      for (int32_t v = 0; v < int32_t(logits->size()); ++v)
        if (v != next && (*logits)[size_t(v)] > (*logits)[size_t(second)]) second = v;
      runner_up.emplace_back(second, (*logits)[size_t(next)] - (*logits)[size_t(second)]);
      if (next == tok.eos_id()) break;
      answer.push_back(next);
      if (t + 1 == answer_tokens) break;
      logits = &seq->decode(next);
    }
  }
  std::printf("{\"n_layers\": %d, \"n_kv_heads\": %d, \"head\": %lld, \"kept\": [", c.n_layers, c.n_kv_heads, head);
  for (size_t l = 0; l < kept.size(); ++l) {
    std::printf("%s[", l ? ", " : "");
    for (size_t h = 0; h < kept[l].size(); ++h) {
      std::printf("%s[", h ? ", " : "");
      for (size_t i = 0; i < kept[l][h].size(); ++i) std::printf("%s%lld", i ? "," : "", (long long)kept[l][h][i]);
      std::printf("]");
    }
    std::printf("]");
  }
  std::printf("], \"answer_ids\": [");
  for (size_t i = 0; i < answer.size(); ++i) std::printf("%s%d", i ? "," : "", answer[i]);
  std::printf("], \"runner_up\": [");
  for (size_t i = 0; i < runner_up.size(); ++i)
    std::printf("%s[%d, %.6g]", i ? ", " : "", runner_up[i].first, double(runner_up[i].second));
  std::printf("], \"answer\": ");
  print_json_string(tok.decode(answer));
  std::printf("}\n");
  return 0;
}

}  // namespace
}  // namespace kvlab

int main(int argc, char** argv) { return kvlab::tool_main("kvlab_kept_positions", kvlab::run, argc, argv); }
