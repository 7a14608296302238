// The protocols through RulerEvaluation::run_cell on the bundled model (evals/ruler_eval.h): a
// recording policy (full attention that logs layer 0 of every step the engine runs) sees the
// prompt-end signal once per sample, on the step whose last row is the context's last token
// (query_agnostic: the question follows as a plain prefill) or the prompt's last token
// (query_aware), after the engine lengthened that chunk to the policy's observation window.
#include <gtest/gtest.h>

#include <filesystem>

#include "evals/ruler_eval.h"
#include "framework/engine/engine.h"
#include "framework/experiment/engine_lm.h"
#include "framework/experiment/experiment.h"
#include "framework/model/model.h"

namespace kvlab {
namespace {

namespace fs = std::filesystem;

struct Step {
  int64_t first_position;
  int n_new;
  bool is_prefill;
  bool prompt_end;
};

class RecordingPolicy final : public AttentionPolicy {
 public:
  static constexpr int kWindow = 48;  // observation window: the engine makes the last chunk this long
  explicit RecordingPolicy(std::vector<Step>* log) : log_(log) {}
  PolicyNeeds needs() const override {
    PolicyNeeds n;
    n.observation_window = kWindow;
    return n;
  }
  void select(const LayerStep& step, KeySelection&) override {
    if (step.layer == 0) log_->push_back({step.positions.front(), step.n_new, step.is_prefill, step.prompt_end});
  }
  void reset() override {}

 private:
  std::vector<Step>* log_;
};

const std::vector<int64_t>& ints(const CellRecord& rec, const std::string& name) {
  return std::get<std::vector<int64_t>>(rec.datasets.at(name).data);
}

TEST(RulerRunCell, ProtocolsSignalThePromptEndAtTheRightToken) {
  const fs::path model_path = fs::path(KVLAB_SOURCE_DIR) / "data/models/kvlab-tiny.gguf";
  if (!fs::exists(model_path)) GTEST_SKIP() << model_path << " absent";
  LoadOptions load;
  load.require_tokenizer = true;
  const std::unique_ptr<Model> model = load_model(model_path, load);
  // Chunks of 128 so the prompts take several; niah_single_1 (noise), passkey and
  // niah_multivalue (several needles, a longer answer).
  const ExperimentSpec spec = parse_experiment_text(
      "model: {path: m.gguf}\npolicies: [{type: full}]\nevals:\n  ruler:\n"
      "    tasks: [niah_single_1, passkey, niah_multivalue]\n    context_lengths: [700]\n    samples: 2\n"
      "    protocol: [query_agnostic, query_aware]\n    haystack: noise\n",
      "r.yaml");
  RulerEvaluation& ruler = const_cast<RulerEvaluation&>(*find_evaluation<RulerEvaluation>(spec));
  ruler.prepare(*model->tokenizer);
  EngineOptions eo;
  eo.threads = 1;
  eo.prefill_chunk_tokens = 128;
  Engine engine(*model, eo);
  std::vector<Step> log;
  EngineLm lm(engine, [&log] { return std::make_unique<RecordingPolicy>(&log); });
  const std::vector<uint64_t> seeds{0};
  ASSERT_EQ(ruler.cell_count(), 6u);
  for (size_t cell = 0; cell < ruler.cell_count(); ++cell) {
    const RulerEvaluation::Coord c = ruler.coord(cell);
    SCOPED_TRACE(ruler.cell_id(cell));
    log.clear();
    EvalContext ctx{lm, *model->tokenizer, model->config, seeds};
    const CellRecord rec = ruler.run_cell(cell, ctx);
    const std::vector<int64_t>& prompt_length = ints(rec, "prompt_length");
    const std::vector<int64_t>& question = ints(rec, "question_tokens");
    const std::vector<int64_t>& answer = ints(rec, "answer_tokens");
    ASSERT_EQ(prompt_length.size(), 2u);
    // The log split into sequences: each starts with the step at position 0.
    std::vector<std::vector<Step>> seqs;
    for (const Step& s : log) {
      if (s.first_position == 0) seqs.emplace_back();
      ASSERT_FALSE(seqs.empty());
      seqs.back().push_back(s);
    }
    ASSERT_EQ(seqs.size(), 2u);
    for (size_t k = 0; k < seqs.size(); ++k) {
      const int64_t n = prompt_length[k];
      const int64_t context_end = c.protocol == NiahProtocol::kQueryAware ? n : n - question[k];
      int ends = 0;
      int64_t fed = 0;  // the steps cover the positions in order, without gaps
      for (size_t i = 0; i < seqs[k].size(); ++i) {
        const Step& s = seqs[k][i];
        EXPECT_EQ(s.first_position, fed) << "sample " << k << " step " << i;
        fed += s.n_new;
        if (!s.prompt_end) continue;
        ++ends;
        EXPECT_EQ(s.first_position + s.n_new, context_end) << "sample " << k;  // its last row ends the context
        EXPECT_TRUE(s.is_prefill);
        EXPECT_GE(s.n_new, std::min<int64_t>(RecordingPolicy::kWindow, context_end));
        if (i + 1 < seqs[k].size()) {
          const Step& next = seqs[k][i + 1];
          if (c.protocol == NiahProtocol::kQueryAgnostic) {  // the question: a plain prefill
            EXPECT_TRUE(next.is_prefill);
            EXPECT_EQ(next.n_new, question[k]);
          } else {  // the answer: decode steps
            EXPECT_EQ(next.n_new, 1);
          }
        }
      }
      EXPECT_EQ(ends, 1) << "sample " << k;
      // Prompt, then one decode step per answer token but the last when the answer reached its
      // length (it is not fed back), or per answer token when EOS ended it.
      EXPECT_GE(fed - n, std::max<int64_t>(answer[k] - 1, 0)) << "sample " << k;
      EXPECT_LE(fed - n, answer[k]) << "sample " << k;
    }
  }
}

}  // namespace
}  // namespace kvlab
