// Test plugin without the kvlab_policy_plugin entry point (the loader must name the symbol).
extern "C" int not_a_kvlab_plugin() { return 42; }
