// The device backends (backend.h) for EngineOptions::device cuda and emulated: the same
// host-side plans, executed by CUDA (device_executor_cuda.cpp) or by CPU loops over
// device-shaped arrays (device_emulator.cpp, device_executor.h), so tests cover everything but
// the CUDA kernels without a GPU.
//
// Division of labour: the host keeps what it keeps on the CPU path — sequences, policies, the
// paged KvStore's block tables, slot metadata and an fp32 copy of every cached K/V row (what
// policies read through LayerCacheView::load_key, probes compare against, and compaction moves)
// — and the device runs the dense layers (cuBLAS), RoPE, the KV pages it attends over (a mirror
// of the host blocks in the device dtype, block b = page b) and the attention kernels. Per layer:
//   device: h = RMSNorm(x); q, k, v = W h (+bias); RoPE at text positions (rows whose policy
//           rotates at cache position are left raw)
//   host:   k, v (and q when a policy or probe reads it) come back; AttentionStep::prepare
//           appends them to the host store and asks the policy for its selection
//   device: pages the host renumbered (compaction) or evicted in are re-uploaded, new rows
//           appended; attention over the selections (decode: FlashDecoding, one launch for the
//           batch; prefill: the tensor-core kernel when every row reads the same lists, or the
//           policy's prefill_mask, and no key mass is needed, else each row as its own decode
//           request); key mass when asked
//   host:   AttentionStep::finish (statistics, probes, policy observation, evictions)
//   device: x += Wo att; x += W_down(silu(W_gate h) * W_up h); logits = lm_head RMSNorm(x).
// CUDA is built only with KVLAB_HAVE_CUDA; without it device cuda is a clear Error.
#pragma once

#include <memory>

#include "framework/engine/backend.h"
#include "framework/kv/kv_store.h"
#include "kernels/cpu/rope.h"

namespace kvlab::engine_detail {

// Throws Error naming the reason when the device cannot be used (this build has no CUDA, no
// GPU, an unsupported model shape or dtype).
std::unique_ptr<Backend> make_device_backend(const Model& model, const EngineOptions& options,
                                             const KvStore& store, const RopeTable& rope);

}  // namespace kvlab::engine_detail
