#include "policies/builtin.h"

namespace kvlab {

void register_builtin_policies(PolicyRegistry& registry) {
  registry.add(make_full_factory());
  registry.add(make_sliding_window_factory());
  registry.add(make_strided_factory());
  registry.add(make_sinks_factory());
  registry.add(make_h2o_factory());
  registry.add(make_landmark_factory());
  registry.add(make_snapkv_factory());
  registry.add(make_pyramidkv_factory());
  registry.add(make_adakv_factory());
  registry.add(make_tova_factory());
  registry.add(make_knorm_factory());
  registry.add(make_random_factory());
  registry.add(make_duo_factory());
}

PolicyRegistry make_builtin_registry() {
  PolicyRegistry r;
  register_builtin_policies(r);
  return r;
}

}  // namespace kvlab
