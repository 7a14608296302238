#include "policies/top_key_probe.h"

#include <algorithm>
#include <cmath>

#include "framework/core/error.h"
#include "policies/cache_scan.h"

namespace kvlab {

void TopKeyRecord::clear() {
  top.assign(size_t(n_layers) * n_heads, -1);
  row_position.assign(size_t(n_layers), -1);
}

TopKeyProbe::TopKeyProbe(std::shared_ptr<TopKeyRecord> record, const PolicyModelShape& shape)
    : record_(std::move(record)), key_(size_t(shape.head_dim)) {
  KVLAB_CHECK(record_ != nullptr && shape.n_kv_heads > 0 && shape.n_heads % shape.n_kv_heads == 0);
  record_->n_layers = shape.n_layers;
  record_->n_heads = shape.n_heads;
  record_->clear();
}

PolicyNeeds TopKeyProbe::needs() const {
  PolicyNeeds n;
  n.queries = true;
  return n;
}

void TopKeyProbe::after_attention(const LayerStep& step, const StepStats&, Evictions&) {
  const int nh = step.shape.n_heads, nkv = step.shape.n_kv_heads, d = step.shape.head_dim;
  const int group = nh / nkv;
  const int r = step.n_new - 1;
  const int64_t i = step.positions[r];
  KVLAB_CHECK(step.queries.size() == size_t(step.n_new) * nh * d);
  const CacheScan scan(*step.cache, nkv);
  std::vector<float> best(static_cast<size_t>(group));
  for (int h = 0; h < nkv; ++h) {
    std::fill(best.begin(), best.end(), -INFINITY);
    int64_t* top = record_->top.data() + size_t(step.layer) * nh + size_t(h) * group;
    for (int g = 0; g < group; ++g) top[g] = -1;
    for (int s = 0; s < scan.n_slots(); ++s) {
      if (!scan.valid(s, h)) continue;
      const int64_t j = scan.position(s, h);
      if (j > i) break;  // positions increase with slots: the rest is causal-masked for row r
      step.cache->load_key(s, h, key_.data());
      for (int g = 0; g < group; ++g) {
        const float* q = step.queries.data() + (size_t(r) * nh + size_t(h) * group + g) * d;
        // fp32 q . k: its rounding can only reorder keys whose scores tie to ~1e-6 relative
        float dot = 0.f;
        for (int f = 0; f < d; ++f) dot += q[f] * key_[f];
        if (dot > best[g]) {  // strict: the earliest of equal scores
          best[g] = dot;
          top[g] = j;
        }
      }
    }
  }
  record_->row_position[size_t(step.layer)] = i;
}

}  // namespace kvlab
