#include "kernels/cpu/sampler.h"

#include <algorithm>
#include <cmath>

#include "kernels/common/error.h"

namespace kvlab {

namespace {
int32_t greedy(std::span<const float> logits) {  // lowest id among equal maxima
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  return best;
}
}  // namespace

Sampler::Sampler(const SamplerOptions& opts) : opts_(opts), rng_(opts.seed) {
  if (!(opts.temperature >= 0.f)) fail("sampler: temperature must be >= 0, got ", opts.temperature);
  if (!(opts.top_p > 0.f)) fail("sampler: top_p must be > 0, got ", opts.top_p);
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (logits.empty()) fail("sampler: empty logits");
  if (opts_.temperature == 0.f) return greedy(logits);
  cand_.clear();
  for (size_t i = 0; i < logits.size(); ++i)
    cand_.emplace_back(logits[i] / opts_.temperature, static_cast<int32_t>(i));
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t k = cand_.size();
  if (opts_.top_k > 0 && static_cast<size_t>(opts_.top_k) < k) {
    k = static_cast<size_t>(opts_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + k, cand_.end(), by_logit);
    cand_.resize(k);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // softmax over the kept candidates (descending), then the top-p prefix
  const float m = cand_[0].first;
  double total = 0;
  for (auto& c : cand_) {
    c.first = std::exp(c.first - m);
    total += c.first;
  }
  size_t keep = cand_.size();
  if (opts_.top_p < 1.f) {
    double mass = 0;
    for (size_t i = 0; i < cand_.size(); ++i) {
      mass += cand_[i].first / total;
      if (mass >= opts_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += cand_[i].first;
  const double u = std::uniform_real_distribution<double>(0.0, kept)(rng_);
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += cand_[i].first;
    if (u < acc) return cand_[i].second;
  }
  return cand_[keep - 1].second;
}

}  // namespace kvlab
