// Greedy decoding of several prompts as shared decode batches, with pre-emption when the KV pool
// runs out: the one place kvlab batches sequences (the runner and the evals run one sequence at
// a time; Engine::decode takes a batch).
//
// Every step decodes all running sequences in one Engine::decode call. When that call finds no
// room (kOutOfBlocks: nothing changed, engine.h), the most recently admitted running sequence is
// pre-empted (vLLM's "recompute" pre-emption): its KV blocks go back to the pool
// (end_sequence) and it returns to the front of the waiting queue with the tokens it has
// produced; the step is retried with the others. New and pre-empted requests are admitted
// (at most max_batch running) only until the first pre-emption, and again whenever a running
// sequence finishes and frees its blocks. A pre-empted request is recomputed on a fresh
// sequence with a fresh policy by the same calls that built it the first time -- prefill of the
// prompt, then one decode per token it had produced -- so it continues where it stopped.
//
// Results: a request's tokens and final logits are those of running it alone (prefill, then
// decode with a batch of one), bit for bit, as long as batches stay below kGemmMinTokens
// (linear.h): the matvec path computes each row of a batch with the same sums as alone; larger
// batches use sgemm, whose sums may differ in the last bits.
//
// A request whose sequence cannot go on even when it runs alone (the pool is too small for it)
// is an Error naming the request, the pool size and what the step needed (the call's sequences
// are ended first, so the engine stays usable). Bad requests (empty prompt, max_new_tokens < 1,
// a prompt longer than max_tokens) throw Error up front. Blocks held by sequences the caller
// keeps outside this call count against the pool.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "framework/engine/engine.h"

namespace kvlab {

struct DecodeRequest {
  std::vector<int32_t> prompt;  // fed by one prefill
  int max_new_tokens = 1;       // tokens chosen greedily (argmax), the first from the prefill
  // A fresh policy for each (re)computation of the request; empty = full attention.
  std::function<std::unique_ptr<AttentionPolicy>()> make_policy;
};

struct DecodeResult {
  std::vector<int32_t> tokens;      // [max_new_tokens] (fewer when the context filled up)
  std::vector<float> final_logits;  // [vocab] the logits the last token was chosen from
  int preemptions = 0;              // times this request was pre-empted and recomputed
  int64_t recomputed_tokens = 0;    // tokens fed again by those recomputations
  bool context_full = false;        // stopped early: EngineOptions::max_tokens reached
};

struct BatchDecodeOptions {
  int max_batch = 4;  // most sequences decoding together
};

std::vector<DecodeResult> decode_batched(Engine& engine, const std::vector<DecodeRequest>& requests,
                                         const BatchDecodeOptions& options = {});

}  // namespace kvlab
