// Test plugin whose descriptor holds both the one-policy fields and a list (the loader must
// refuse it, naming the file, before creating any factory).
#include "framework/policy/plugin.h"

namespace {
kvlab::PolicyFactory* no_factory() { return nullptr; }
const KvlabPolicyPluginEntry kEntries[] = {{"listed", &no_factory}};
}  // namespace

extern "C" __attribute__((visibility("default"))) const KvlabPolicyPlugin* kvlab_policy_plugin() {
  static const KvlabPolicyPlugin plugin{kKvlabPolicyApiVersion, "single", &no_factory, 1, kEntries};
  return &plugin;
}
