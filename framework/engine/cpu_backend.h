// The CPU backend (backend.h): the dense layers of dense_layers.h on the engine's thread pool,
// RoPE with the host table, and kernels/cpu attention over the host KV store.
#pragma once

#include <memory>

#include "framework/engine/backend.h"
#include "framework/engine/layer_rope.h"
#include "framework/kv/kv_store.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/thread_pool.h"

namespace kvlab::engine_detail {

std::unique_ptr<Backend> make_cpu_backend(const Model& model, ThreadPool& pool, const KvStore& store,
                                          const LayerRopes& rope);

}  // namespace kvlab::engine_detail
