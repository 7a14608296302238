// The built-in attention policies (one short file each in policies/) and their registration.
//
//   full            exact attention over every cached key (tiled online softmax kernel)
//   sliding_window  the W most recent keys (POLICIES.md 2); evicts or masks
//   strided         Sparse Transformer strided / fixed patterns (POLICIES.md 3)
//   sinks           StreamingLLM: S sinks + R recent, evicted after each step (POLICIES.md 4)
//   h2o             heavy hitters by accumulated attention mass (POLICIES.md 5), a ScorerPolicy
//   landmark        training-free HiLS-style chunk selection (POLICIES.md 6)
//   snapkv          observation-window scores, compressed at the prompt end (POLICIES.md 11)
//   pyramidkv       snapkv scores, budgets decreasing with depth (POLICIES.md 12)
//   adakv           any scorer's budget allocated across KV heads (POLICIES.md 13)
//   tova            the current query's attention, evicting every step (POLICIES.md 14)
//   knorm           lowest-L2-norm keys (arXiv 2406.11430)
//   random          seeded random eviction: the floor
//   duo             DuoAttention: retrieval heads keep all, streaming heads sinks + recent (16)
#pragma once

#include <memory>

#include "framework/policy/policy.h"
#include "framework/policy/registry.h"

namespace kvlab {

std::unique_ptr<PolicyFactory> make_full_factory();
std::unique_ptr<PolicyFactory> make_sliding_window_factory();
std::unique_ptr<PolicyFactory> make_strided_factory();
std::unique_ptr<PolicyFactory> make_sinks_factory();
std::unique_ptr<PolicyFactory> make_h2o_factory();
std::unique_ptr<PolicyFactory> make_landmark_factory();
std::unique_ptr<PolicyFactory> make_snapkv_factory();
std::unique_ptr<PolicyFactory> make_pyramidkv_factory();
std::unique_ptr<PolicyFactory> make_adakv_factory();
std::unique_ptr<PolicyFactory> make_tova_factory();
std::unique_ptr<PolicyFactory> make_knorm_factory();
std::unique_ptr<PolicyFactory> make_random_factory();
std::unique_ptr<PolicyFactory> make_duo_factory();

// Adds the built-ins to `registry`.
void register_builtin_policies(PolicyRegistry& registry);
// A registry holding the built-ins.
PolicyRegistry make_builtin_registry();

}  // namespace kvlab
