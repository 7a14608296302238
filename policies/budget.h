// One budget convention for every evicting or selecting policy (POLICIES.md 9).
//
// `compression_ratio` r means what it means in kvpress: the fraction of the context removed; n
// tokens keep n - floor(r * n) (POLICIES.md 9; r = 0 keeps everything). kvpress 0.5.5 itself keeps
// int(n * (1 - r)), one token fewer when r * n is not whole (docs/models/peer.md). `budget_tokens`
// B > 0 says the same as a count
// (keep min(n, B)). At most one of the two may be set. For decode-time policies in a streaming
// run, n is the number of tokens seen so far (kvlab choice, as H2O's ratio budgets). Whatever a
// policy protects on top of its scores (sinks, an observation window, recent tokens) counts
// INSIDE this budget, never beside it.
#pragma once

#include <cstdint>

#include "framework/policy/params.h"

namespace kvlab {

struct TokenBudget {
  double compression_ratio = 0;  // [0, 1)
  int64_t budget_tokens = 0;     // 0 = not set (use compression_ratio)

  bool limited() const { return compression_ratio > 0 || budget_tokens > 0; }
  // Tokens kept out of n (n when unlimited); never more than n.
  int64_t kept(int64_t n) const;

  // Reads the two parameters declared by budget_param_specs(); Error naming both when both are
  // set.
  static TokenBudget from_params(const ParamValues& p);
};

// Per layer kind (Gemma 2/3's local sliding-window layers, LayerStep::sliding_window > 0, beside
// its global ones): `budget_layers` says which layers the budget above applies to. "all" (the
// default): every layer, a local one keeping min(its window, the budget). "global": global layers
// only; a local layer keeps what the model's window leaves it, as under `full` (the engine evicts
// what falls out of the window). On a model without local layers the two are the same.
// Only the policies that declare it take it (README.md, "Budgets per layer kind").
ParamSpec budget_layers_param_spec();
// p's budget_layers is "global".
bool budget_global_layers_only(const ParamValues& p);

// {compression_ratio (float in [0, 1), default `default_ratio`), budget_tokens (int >= 0,
// default 0 = unset)}. Append them to a policy's own specs.
ParamSpecs budget_param_specs(double default_ratio = 0.0);
// `specs` followed by budget_param_specs(default_ratio).
ParamSpecs with_budget_params(ParamSpecs specs, double default_ratio = 0.0);

}  // namespace kvlab
