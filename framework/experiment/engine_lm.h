// EngineLm: the Engine as the evaluations see it (evals/lm.h), for `kvlab run` (runner.cpp) and
// `kvlab perplexity`: every start() is a fresh sequence with a fresh policy from `make_policy`.
// Keeps the time spent in prefill and decode and the statistics of every sequence when it
// ends. A step the engine refuses (out of KV blocks, context full) throws LmStepError
// ("<status> after <n> tokens"), which the evaluations record as where the sample stopped,
// except an exhausted KV pool (kv.budget_bytes): that says nothing about the policy, so it throws
// KvPoolExhausted (with the blocks held, needed and free) and the run stops with one error.
//
// Prefix reuse (PrefixCache, engine.prefix_reuse): the first prefill of a sequence keeps a frozen
// fork of the store (copy-on-write, kv_store.h) at every prefill-chunk boundary of its prompt; a
// later sequence whose prompt starts with the same tokens forks the longest such snapshot
// instead of prefilling those tokens again. Only chunk boundaries the new prompt's own prefill
// would pass through (multiples of engine.prefill_chunk before its last chunk, engine.cpp
// prefill_chunks) are fork points, so every remaining chunk has the rows, the positions and the
// cache it has without reuse, and logits and KV are bit for bit those of a run without reuse.
// The child gets a fresh policy (a policy's state cannot be copied, engine.h Engine::fork), so
// the runner uses a cache only where the fresh policy equals the one that prefilled the prefix:
// full attention (runner.cpp prefix_reuse_allowed).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "evals/lm.h"
#include "framework/core/error.h"
#include "framework/engine/engine.h"

namespace kvlab {

// The KV pool had no room for a step; run_experiment adds the file, key and cell.
class KvPoolExhausted : public Error {
 public:
  using Error::Error;
};

// Snapshots of recent prompts' prefixes on one engine (one KV store). Each chain is one prompt's
// first prefill: at[k] is a sequence holding exactly its first (k + 1) * chunk tokens. At most
// max_chains chains are kept (the least recently used goes first), and chains are dropped when
// the pool has fewer free blocks than one sequence of the engine's max_tokens needs, so reuse
// never takes the room a sequence would have had without it.
class PrefixCache {
 public:
  explicit PrefixCache(Engine& engine, int max_chains = 4) : engine_(engine), max_chains_(max_chains) {}
  ~PrefixCache() { clear(); }
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;
  void clear();  // frees every snapshot
  Engine& engine() const { return engine_; }

  int64_t tokens_saved = 0;  // prompt tokens forked instead of prefilled, since construction

  struct Hit {
    SeqId seq = -1;              // the snapshot holding tokens[0, tokens)
    int64_t tokens = 0;          // 0: none
    std::vector<SeqId> prefix;   // its chain's snapshots up to it (the new chain forks them)
  };
  // The longest snapshot whose tokens begin `tokens`, of at most `limit` tokens.
  Hit find(std::span<const int32_t> tokens, int64_t limit);
  // Takes the snapshots of a new chain (at[k] holds tokens[0, (k + 1) * chunk)); drops the
  // least recently used chain past max_chains.
  void push_chain(std::span<const int32_t> tokens, std::vector<SeqId> at);
  // Drops chains (least recently used first) until the pool can hold a sequence of the
  // engine's max_tokens beside them, or none is left.
  void make_room();

 private:
  struct Chain {
    std::vector<int32_t> tokens;
    std::vector<SeqId> at;
    uint64_t used = 0;
  };
  void drop(size_t chain);
  size_t least_recent() const;
  Engine& engine_;
  int max_chains_;
  std::vector<Chain> chains_;
  uint64_t clock_ = 0;
};

class EngineLm : public LanguageModel {
 public:
  using PolicyMaker = std::function<std::unique_ptr<AttentionPolicy>()>;
  EngineLm(Engine& engine, PolicyMaker make_policy)
      : engine_(engine), make_policy_(std::move(make_policy)) {}

  int32_t vocab_size() const override { return engine_.config().vocab_size; }
  std::unique_ptr<LmSequence> start(uint64_t seed) override;

  double prefill_s = 0, decode_s = 0;
  int64_t prefill_tokens = 0, decode_tokens = 0;
  std::vector<SequenceStats> ended;  // in the order the sequences ended
  std::function<void(int64_t)> on_tokens;  // tokens fed so far (every prefill, every 16 decodes)
  // Called right after a prefill that ended the prompt (the policy has compressed): what the
  // evaluations read of the cache there (NIAH: which needle tokens each layer kept).
  std::function<void(SeqId)> on_prompt_end;
  // Prefix reuse (above): set only where the policy allows it (full attention); nullptr = off.
  PrefixCache* prefix_cache = nullptr;
  int64_t prefill_tokens_saved = 0;  // forked instead of prefilled, since reset_counters()
  const Engine& engine() const { return engine_; }

  void reset_counters() {
    prefill_s = decode_s = 0;
    prefill_tokens = decode_tokens = 0;
    prefill_tokens_saved = 0;
    ended.clear();
  }

 private:
  class Seq;
  Engine& engine_;
  PolicyMaker make_policy_;
};

}  // namespace kvlab
