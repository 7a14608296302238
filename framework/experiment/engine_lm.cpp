// EngineLm (engine_lm.h).
#include "framework/experiment/engine_lm.h"

#include <algorithm>
#include <chrono>

namespace kvlab {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The last multiple of `chunk` a prefill of n tokens passes through before its last chunk
// (engine.cpp prefill_chunks: the last chunk is n % chunk, or chunk, lengthened to min(n,
// window) rows when the call ends the prompt and the policy observes a window; the chunks before
// it start at multiples of chunk). Feeding [0, b) and then [b, n) makes the same chunks.
int64_t shared_boundary(int64_t n, int64_t chunk, int64_t window) {
  int64_t last = n % chunk == 0 ? std::min(n, chunk) : n % chunk;
  last = std::max(last, std::min(n, window));
  return (n - last) / chunk * chunk;
}

}  // namespace

void PrefixCache::clear() {
  while (!chains_.empty()) drop(chains_.size() - 1);
}

void PrefixCache::drop(size_t chain) {
  for (SeqId s : chains_[chain].at) engine_.end_sequence(s);
  chains_.erase(chains_.begin() + std::ptrdiff_t(chain));
}

size_t PrefixCache::least_recent() const {
  size_t oldest = 0;
  for (size_t i = 1; i < chains_.size(); ++i)
    if (chains_[i].used < chains_[oldest].used) oldest = i;
  return oldest;
}

PrefixCache::Hit PrefixCache::find(std::span<const int32_t> tokens, int64_t limit) {
  const int64_t chunk = engine_.options().prefill_chunk_tokens;
  Hit best;
  Chain* used = nullptr;
  for (Chain& c : chains_) {
    const int64_t n = std::min<int64_t>({int64_t(c.at.size()) * chunk, limit, int64_t(tokens.size())});
    int64_t m = 0;
    while (m < n && c.tokens[size_t(m)] == tokens[size_t(m)]) ++m;
    const int64_t k = m / chunk;  // snapshots wholly inside the common prefix
    if (k > 0 && k * chunk > best.tokens) {
      best.seq = c.at[size_t(k - 1)];
      best.tokens = k * chunk;
      best.prefix.assign(c.at.begin(), c.at.begin() + k);
      used = &c;
    }
  }
  if (used) used->used = ++clock_;
  return best;
}

void PrefixCache::push_chain(std::span<const int32_t> tokens, std::vector<SeqId> at) {
  while (!chains_.empty() && int(chains_.size()) >= max_chains_) drop(least_recent());
  if (max_chains_ < 1) {
    for (SeqId s : at) engine_.end_sequence(s);
    return;
  }
  chains_.push_back(Chain{std::vector<int32_t>(tokens.begin(), tokens.end()), std::move(at), ++clock_});
}

void PrefixCache::make_room() {
  const KvStore& kv = engine_.kv();
  const int64_t bs = kv.config().block_size_tokens;
  const int64_t need = (engine_.options().max_tokens + bs - 1) / bs * kv.config().n_layers;
  while (!chains_.empty() && kv.free_blocks() < need) drop(least_recent());
}

class EngineLm::Seq : public LmSequence {
 public:
  Seq(EngineLm& lm, uint64_t seed) : lm_(lm), seed_(seed) {}
  ~Seq() override {
    if (id_ < 0) return;  // never fed
    lm_.ended.push_back(lm_.engine_.sequence_stats(id_));
    lm_.engine_.end_sequence(id_);
  }
  const std::vector<float>& prefill(std::span<const int32_t> tokens, bool all_logits,
                                    bool prompt_end) override {
    const auto t0 = Clock::now();
    if (id_ < 0)
      first_prefill(tokens, all_logits, prompt_end);
    else
      feed(tokens, all_logits, prompt_end);
    lm_.prefill_s += seconds_since(t0);
    lm_.prefill_tokens += int64_t(tokens.size());
    if (lm_.on_tokens) lm_.on_tokens(lm_.prefill_tokens + lm_.decode_tokens);
    if (prompt_end && lm_.on_prompt_end) lm_.on_prompt_end(id_);
    return logits_;
  }
  const std::vector<float>& decode(int32_t token) override {
    if (id_ < 0) id_ = lm_.engine_.start_sequence(lm_.make_policy_(), seed_);
    const auto t0 = Clock::now();
    check(lm_.engine_.decode(std::span(&id_, 1), std::span(&token, 1), logits_), 1);
    lm_.decode_s += seconds_since(t0);
    ++lm_.decode_tokens;
    if (lm_.on_tokens && lm_.decode_tokens % 16 == 0) lm_.on_tokens(lm_.prefill_tokens + lm_.decode_tokens);
    return logits_;
  }

 private:
  // One engine prefill call, its status checked.
  void feed(std::span<const int32_t> tokens, bool all_logits, bool prompt_end) {
    const int64_t before = lm_.engine_.n_tokens(id_);
    const StepStatus st = lm_.engine_.prefill(id_, tokens, logits_, all_logits, prompt_end);
    // prefill stops at the chunk that found no room (engine.h): that chunk is the need
    const int64_t left = int64_t(tokens.size()) - (lm_.engine_.n_tokens(id_) - before);
    check(st, int(std::min<int64_t>(left, lm_.engine_.options().prefill_chunk_tokens)));
  }
  // The sequence starts here. Without a prefix cache (or for all logits: perplexity) it is one
  // prefill call. With one: fork the longest snapshot the prompt's own chunking passes through,
  // feed the rest a chunk per call up to the last shared boundary, snapshotting after each, then
  // the last part with the caller's flags -- the chunks one call would make (shared_boundary).
  void first_prefill(std::span<const int32_t> tokens, bool all_logits, bool prompt_end) {
    std::unique_ptr<AttentionPolicy> policy = lm_.make_policy_();
    PrefixCache* cache = lm_.prefix_cache;
    if (!cache || all_logits) {
      id_ = lm_.engine_.start_sequence(std::move(policy), seed_);
      feed(tokens, all_logits, prompt_end);
      return;
    }
    Engine& engine = lm_.engine_;
    const int64_t chunk = engine.options().prefill_chunk_tokens;
    const int64_t window = prompt_end && policy ? policy->needs().observation_window : 0;
    const int64_t limit = shared_boundary(int64_t(tokens.size()), chunk, window);
    cache->make_room();
    const PrefixCache::Hit hit = cache->find(tokens, limit);
    id_ = hit.seq >= 0 ? engine.fork(hit.seq, std::move(policy)) : engine.start_sequence(std::move(policy), seed_);
    lm_.prefill_tokens_saved += hit.tokens;
    cache->tokens_saved += hit.tokens;
    if (hit.tokens < limit) {  // a chain for this prompt: the shared snapshots, then its own
      std::vector<SeqId> at;
      for (SeqId s : hit.prefix) at.push_back(engine.fork(s, lm_.make_policy_()));
      for (int64_t pos = hit.tokens; pos < limit; pos += chunk) {
        feed(tokens.subspan(size_t(pos), size_t(chunk)), false, false);
        at.push_back(engine.fork(id_, lm_.make_policy_()));
      }
      cache->push_chain(tokens.first(size_t(limit)), std::move(at));
    }
    feed(tokens.subspan(size_t(limit)), all_logits, prompt_end);
  }
  void check(StepStatus s, int n_new) {
    if (s == StepStatus::kOutOfBlocks) {
      const KvStore& kv = lm_.engine_.kv();
      const int64_t held = kv.sequence_blocks(id_), needed = kv.blocks_needed(id_, n_new);
      throw KvPoolExhausted(str_cat(
          "the pool holds ", kv.stats().blocks_total, " KV blocks of ", kv.block_bytes(),
          " bytes; after ", lm_.engine_.n_tokens(id_), " tokens the sequence holds ", held,
          " and its next step (", n_new, " token", n_new == 1 ? "" : "s", ") needs ", needed,
          " more, ", kv.free_blocks(), " free: at least ", size_t(held + needed) * kv.block_bytes(),
          " bytes"));
    }
    if (s != StepStatus::kOk)
      throw LmStepError(str_cat(step_status_name(s), " after ", lm_.engine_.n_tokens(id_), " tokens"));
  }
  EngineLm& lm_;
  uint64_t seed_;
  SeqId id_ = -1;  // started at the first prefill (or decode)
  std::vector<float> logits_;
};

std::unique_ptr<LmSequence> EngineLm::start(uint64_t seed) { return std::make_unique<Seq>(*this, seed); }

}  // namespace kvlab
