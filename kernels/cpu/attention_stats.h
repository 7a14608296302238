// Observation-window statistics of one attention step (SnapKV's window, TOVA's last query):
// per QUERY head, the softmax probability the step's last rows gave each slot,
//   out[h * n_slots + s] += sum_{r in [first_row, n_rows)} p_s(r, h)
// with p_s(r, h) exactly attention's (kernels/cpu/attention.h: the same candidate set J(r, h) of
// the selection, valid and causal slots, keys rotated at read when `rope` is set), computed in
// double from the same q and keys. Slots a row did not read get nothing. An empty J adds
// nothing. args.out / lse / key_mass / head_mass are ignored.
//
// The engine's CPU path gets these from the tiled kernel itself (AttentionArgs::head_mass: no
// key read twice); this separate pass serves the backends whose kernels do not produce them
// (the device paths) and the policy simulator. It reads the window rows' keys once more:
// (n_rows - first_row) x n_heads x |J| dot products in double.
#pragma once

#include "kernels/cpu/attention.h"

namespace kvlab {

void window_attention(const AttentionArgs& args, int first_row, float* out);

}  // namespace kvlab
