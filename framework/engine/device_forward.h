// The Engine's forward pass on a device (EngineOptions::device = "cuda", or "emulated": the same
// host-side plans executed by CPU loops over device-shaped arrays, device_executor.h, so tests
// cover everything but the CUDA kernels without a GPU).
//
// Division of labour: the host keeps what it keeps on the CPU path — sequences, policies, the
// paged KvStore's block tables, slot metadata and an fp32 copy of every cached K/V row (what
// policies read through LayerCacheView::load_key, probes compare against, and compaction moves)
// — and the GPU runs the dense layers (cuBLAS), RoPE, the KV pages it attends over (a mirror of
// the host blocks in the device dtype, block b = page b) and the attention kernels. Per layer:
//   GPU:  h = RMSNorm(x); q, k, v = W h (+bias); RoPE at text positions (rows whose policy
//         rotates at cache position are left raw)
//   host: k, v (and q when a policy or probe reads it) come back; Engine::begin_attention
//         appends them to the host store and asks the policy for its selection
//   GPU:  pages the host renumbered (compaction) or evicted in are re-uploaded, new rows
//         appended; attention over the selections (decode: FlashDecoding, one launch for the
//         batch; prefill: the tensor-core kernel when every row reads the same lists, or the
//         policy's prefill_mask, and no key mass is needed, else each row as its own decode
//         request); key mass when asked
//   host: Engine::end_attention (statistics, probes, policy observation, evictions)
//   GPU:  x += Wo att; x += W_down(silu(W_gate h) * W_up h); logits = lm_head RMSNorm(x).
// The device work is a DeviceExecutor (device_executor.h); this file's implementation
// (device_forward.cpp) is the host side: RoPE positions, the mirror bookkeeping and the launch
// plans. CUDA is built only with KVLAB_HAVE_CUDA; without it device "cuda" is a clear Error.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "framework/engine/engine.h"
#include "framework/engine/engine_internal.h"

namespace kvlab {

class DeviceForward {
 public:
  virtual ~DeviceForward() = default;
  // For options(engine).device "cuda" or "emulated". Throws Error naming the reason when the
  // device cannot be used (this build has no CUDA, no GPU, an unsupported model shape or dtype).
  static std::unique_ptr<DeviceForward> create(Engine& engine);

  // Engine::forward on the device: embeddings of `tokens` (one row each), every layer, and the
  // logits of `logit_rows` into logits [logit_rows.size(), vocab] (host memory).
  virtual void forward(std::span<engine_detail::Group> groups, std::span<const int32_t> tokens,
                       std::span<const int> logit_rows, float* logits) = 0;
  // The sequence ended (its blocks go back to the host pool): forget what was mirrored for it.
  virtual void end_sequence(SeqId seq) = 0;

 protected:
  // Engine's internals, for implementations (friendship is not inherited).
  static const Model& model(const Engine& e) { return e.model_; }
  static const EngineOptions& options(const Engine& e) { return e.opts_; }
  static KvStore& store(Engine& e) { return *e.store_; }
  static const RopeTable& cache_rope(const Engine& e) { return e.cache_rope_; }
  static void begin_attention(Engine& e, engine_detail::Group& g, int layer, float* q, float* k,
                              const float* v) {
    e.begin_attention(g, layer, q, k, v, /*text_rope_done=*/true);
  }
  // True when the policy evicted something (the layer's page metadata changed).
  static bool end_attention(Engine& e, engine_detail::Group& g, int layer, const float* out) {
    return e.end_attention(g, layer, out);
  }
};

// "NVIDIA H200 (sm_90, 139.8 GiB)" for the first GPU, or why none can be used.
std::string cuda_device_summary();
// True when this build has CUDA and a GPU is visible.
bool cuda_device_available();

}  // namespace kvlab
