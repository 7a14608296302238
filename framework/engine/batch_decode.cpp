#include "framework/engine/batch_decode.h"

#include <algorithm>
#include <deque>
#include <span>

#include "framework/core/error.h"

namespace kvlab {
namespace {

int32_t argmax_row(const float* row, int32_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

struct Running {
  size_t request = 0;
  SeqId seq = -1;
};

// What a step that found no room needed, for the error when a request cannot run even alone.
std::string shortfall(const Engine& engine, SeqId seq, size_t request, int n_new) {
  const KvStore& kv = engine.kv();
  const int64_t held = kv.sequence_blocks(seq), needed = kv.blocks_needed(seq, n_new);
  return str_cat("decode_batched: request ", request, " does not fit in the KV pool even alone: after ",
                 engine.n_tokens(seq), " tokens its sequence holds ", held, " blocks and its next step needs ",
                 needed, " more, ", kv.free_blocks(), " of ", kv.stats().blocks_total, " free (", kv.block_bytes(),
                 " bytes each): the pool needs at least ", size_t(held + needed) * kv.block_bytes(),
                 " bytes (EngineOptions::kv_budget_bytes)");
}

}  // namespace

std::vector<DecodeResult> decode_batched(Engine& engine, const std::vector<DecodeRequest>& requests,
                                         const BatchDecodeOptions& options) {
  if (options.max_batch < 1) fail("decode_batched: max_batch must be >= 1, got ", options.max_batch);
  for (size_t r = 0; r < requests.size(); ++r) {
    if (requests[r].prompt.empty()) fail("decode_batched: request ", r, " has an empty prompt");
    if (requests[r].max_new_tokens < 1)
      fail("decode_batched: request ", r, ": max_new_tokens must be >= 1, got ", requests[r].max_new_tokens);
    if (int64_t(requests[r].prompt.size()) > engine.options().max_tokens)
      fail("decode_batched: request ", r, ": a prompt of ", requests[r].prompt.size(), " tokens exceeds max_tokens ",
           engine.options().max_tokens);
  }
  const int32_t vocab = engine.config().vocab_size;
  std::vector<DecodeResult> results(requests.size());
  std::deque<size_t> waiting;
  for (size_t r = 0; r < requests.size(); ++r) waiting.push_back(r);
  std::vector<Running> running;  // in admission order
  std::vector<float> logits;
  bool admit = true;  // cleared by a pre-emption, set again when a sequence finishes

  // On an error the engine is left without this call's sequences.
  auto end_all = [&] {
    for (const Running& r : running) engine.end_sequence(r.seq);
    running.clear();
  };
  // Ends a request that produced all its tokens (or filled the context).
  auto finish = [&](size_t i) {
    engine.end_sequence(running[i].seq);
    running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
    admit = true;
  };

  // Starts request r on a fresh sequence and replays what it produced before a pre-emption.
  // Returns false (sequence ended, nothing kept) when the pool has no room; throws when it has
  // no room although nothing else is running.
  auto start = [&](size_t r) -> bool {
    const DecodeRequest& q = requests[r];
    DecodeResult& res = results[r];
    const SeqId seq = engine.start_sequence(q.make_policy ? q.make_policy() : nullptr);
    auto no_room = [&](int n_new) {
      if (running.empty()) {
        const std::string why = shortfall(engine, seq, r, n_new);
        engine.end_sequence(seq);
        fail(why);
      }
      engine.end_sequence(seq);
      return false;
    };
    const bool recompute = !res.tokens.empty();
    StepStatus st = engine.prefill(seq, q.prompt, logits);
    if (st == StepStatus::kOutOfBlocks)
      return no_room(int(std::min<int64_t>(int64_t(q.prompt.size()) - engine.n_tokens(seq),
                                           engine.options().prefill_chunk_tokens)));
    KVLAB_CHECK(st == StepStatus::kOk, "prompt length was checked against max_tokens");
    if (recompute) res.recomputed_tokens += int64_t(q.prompt.size());
    if (!recompute) {
      res.tokens.push_back(argmax_row(logits.data(), vocab));
      res.final_logits = logits;
    }
    // The tokens it had fed before (all produced but the last, which is the next to feed).
    for (size_t k = 0; k + 1 < res.tokens.size(); ++k) {
      st = engine.decode(std::span(&seq, 1), std::span(&res.tokens[k], 1), logits);
      if (st == StepStatus::kOutOfBlocks) return no_room(1);
      KVLAB_CHECK(st == StepStatus::kOk, "a replayed token passed max_tokens");
      ++res.recomputed_tokens;
    }
    running.push_back({r, seq});
    if (int(res.tokens.size()) == q.max_new_tokens) finish(running.size() - 1);
    return true;
  };

  try {
    while (!waiting.empty() || !running.empty()) {
      if (running.empty()) admit = true;
      while (admit && !waiting.empty() && int(running.size()) < options.max_batch) {
        const size_t r = waiting.front();
        waiting.pop_front();
        if (!start(r)) {
          waiting.push_front(r);
          admit = false;
        }
      }
      if (running.empty()) continue;

      std::vector<SeqId> seqs;
      std::vector<int32_t> tokens;
      for (const Running& r : running) {
        seqs.push_back(r.seq);
        tokens.push_back(results[r.request].tokens.back());
      }
      const StepStatus st = engine.decode(seqs, tokens, logits);
      if (st == StepStatus::kOk) {
        for (size_t i = running.size(); i-- > 0;) {
          DecodeResult& res = results[running[i].request];
          const float* row = logits.data() + i * size_t(vocab);
          res.tokens.push_back(argmax_row(row, vocab));
          res.final_logits.assign(row, row + vocab);
          if (int(res.tokens.size()) == requests[running[i].request].max_new_tokens) finish(i);
        }
      } else if (st == StepStatus::kContextFull) {
        // Nothing changed; the sequences at max_tokens stop, the others step again.
        for (size_t i = running.size(); i-- > 0;)
          if (engine.n_tokens(running[i].seq) + 1 > engine.options().max_tokens) {
            results[running[i].request].context_full = true;
            finish(i);
          }
      } else {  // kOutOfBlocks: nothing changed; pre-empt the youngest, or give up when alone
        if (running.size() == 1) fail(shortfall(engine, running[0].seq, running[0].request, 1));
        const Running victim = running.back();
        running.pop_back();
        engine.end_sequence(victim.seq);
        ++results[victim.request].preemptions;
        waiting.push_front(victim.request);
        admit = false;
      }
    }
  } catch (...) {
    end_all();
    throw;
  }
  return results;
}

}  // namespace kvlab
