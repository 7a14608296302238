// Retrieval-head calibration: the retrieval score of Wu et al. ("Retrieval Head Mechanistically
// Explains Long-Context Factuality", arXiv 2404.15574; nightdessert/Retrieval_Head), the
// training-free way kvlab classifies heads for the `duo` policy (POLICIES.md 16).
//
// For each trial (context length x depth x trial; the NIAH prompt of evals/niah.h, full
// attention), the prompt is prefilled and the answer decoded greedily for as many tokens as
// the value has (prompt.expected_tokens; stopping at EOS). At each answer step k the model
// emits token w_k from the logits of its latest call; a query head scores a HIT for that step
// when the key it attended to most in that call's last row (the argmax of its attention,
// TopKeySource) lies in the needle, tokens [needle_pos, needle_pos + needle_tokens), and holds
// w_k itself (Wu et al.: the head copies the token the model emits). Then
//   score(layer, head_idx) = hits / copy tokens,
// where copy tokens = sum over trials of |expected_tokens| (the value's tokens: the part of the
// needle the question asks the model to copy; Wu et al. divide by the needle's length because
// their model is asked to repeat the whole needle). A head that attends to the copied needle
// token at every answer step of a correct answer scores 1; one that never does, 0.
// Per (layer, KV head), the MAX over the KV head's G query heads (kvlab choice): the KV head's
// cache must stay whole if any one of its query heads retrieves through it, and a mean would
// dilute a single retrieval query head by G (in the bundled model, layer 2's KV head serves the
// induction head 0 and the trained head 1).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "evals/lm.h"
#include "evals/niah.h"
#include "framework/tokenizer/tokenizer.h"

namespace kvlab {

// Where the calibration reads each head's top key: after every call of the LanguageModel's
// sequence, the text position of the most-attended key of that call's last row, per layer and
// query head ([n_layers * n_heads], layer-major). Implemented over the TopKeyProbe policy
// (policies/top_key_probe.h) for the engine; by fakes in tests.
class TopKeySource {
 public:
  virtual ~TopKeySource() = default;
  virtual int n_layers() const = 0;
  virtual int n_heads() const = 0;
  virtual int n_kv_heads() const = 0;
  virtual std::vector<int64_t> top_positions() const = 0;
};

struct RetrievalCalibrationOptions {
  std::vector<int> context_lengths = {256, 512, 1024};
  std::vector<double> depths = {0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100};
  int trials = 1;       // per (length, depth)
  uint64_t seed = 0;    // trial t of cell c gets seed + 1000003 * c + t (distinct prompts)
  NiahOptions niah;
  std::function<void(int done, int total)> on_trial;  // progress (optional)
};

struct RetrievalCalibration {
  int n_layers = 0, n_heads = 0, n_kv_heads = 0;
  std::vector<int64_t> hits;        // [n_layers * n_heads]
  std::vector<double> head_score;   // [n_layers * n_heads]: hits / copy_tokens
  std::vector<double> kv_score;     // [n_layers * n_kv_heads]: max over the group
  int64_t copy_tokens = 0;          // denominator
  int trials = 0, correct = 0;      // NIAH exact-match answers among the trials
};

// Throws kvlab::Error for an empty grid, a length the prompt cannot fit (build_niah_prompt), or
// a source whose shape is inconsistent (n_heads not a multiple of n_kv_heads).
RetrievalCalibration calibrate_retrieval_heads(LanguageModel& lm, TopKeySource& source,
                                               const Tokenizer& tokenizer, const Haystack& haystack,
                                               const RetrievalCalibrationOptions& options);

}  // namespace kvlab
