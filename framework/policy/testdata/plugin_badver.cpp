// Test plugin whose descriptor carries a wrong API version (the loader must name both).
#include "framework/policy/plugin.h"

extern "C" __attribute__((visibility("default"))) const KvlabPolicyPlugin* kvlab_policy_plugin() {
  static const KvlabPolicyPlugin plugin{kKvlabPolicyApiVersion + 998, "badver", nullptr, 0, nullptr};
  return &plugin;
}
