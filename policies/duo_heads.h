// The head file of the `duo` policy (POLICIES.md 16): one retrieval score per (layer, KV head),
// written by `kvlab calibrate-heads` (evals/retrieval_heads.h) and read by policies/duo.cpp.
//
// Format (UTF-8 text, '\n' line ends, fields separated by one TAB):
//   # kvlab duo heads v1                       line 1: the magic comment (required)
//   # model=kvlab-tiny.gguf lengths=...        any further '#' lines: free comments (the writer
//                                              names the model file and the calibration settings)
//   layer<TAB>kv_head<TAB>score                the header (required, exactly these names)
//   0<TAB>0<TAB>0.142857                       one row per (layer, KV head) pair: decimal integers
//   ...                                        and a finite score in [0, 1]; any row order
// Every pair of the model must appear exactly once. Blank lines are errors (a truncated or
// hand-edited file should not pass silently).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvlab {

struct HeadScores {
  int n_layers = 0;
  int n_kv_heads = 0;
  std::vector<double> score;  // [n_layers * n_kv_heads]: score[layer * n_kv_heads + kv_head]
  double at(int layer, int kv_head) const { return score[size_t(layer) * n_kv_heads + kv_head]; }
};

// Reads and validates `path` for a model of n_layers x n_kv_heads: throws kvlab::Error naming
// the file and line (unreadable file, missing magic or header, wrong field count, a non-integer
// or out-of-range layer / kv_head, a score that is not a finite number in [0, 1], a duplicate
// pair) or naming the file and the first missing pair.
HeadScores read_head_file(const std::string& path, int n_layers, int n_kv_heads);

// Writes `scores` in the format above; `comment` lines (without '#', no newlines) follow the
// magic line. Scores are written with 9 significant digits. Throws kvlab::Error naming the file
// when it cannot be written.
void write_head_file(const std::string& path, const HeadScores& scores,
                     const std::vector<std::string>& comment);

// The retrieval heads: the ceil(fraction * P) highest-scoring of the P = n_layers * n_kv_heads
// pairs (ties: lower layer, then lower KV head), as a mask [n_layers * n_kv_heads]. Rounding up
// keeps at least the requested fraction of the cache, and is what the reference's quantile
// threshold (mit-han-lab/duo-attention duo_attn/utils.py sparsify_attention_heads: heads >=
// quantile(scores, 1 - fraction)) gives for distinct scores.
std::vector<uint8_t> top_fraction_heads(const HeadScores& scores, double fraction);

}  // namespace kvlab
