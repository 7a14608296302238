// kvlab_policy_trace: runs one policy through the engine-free simulator (policy_testing.h) and
// prints, as JSON, the simulator's inputs (q and k of every layer and position, exactly as the
// policy saw them) and which positions each (layer, KV head) kept after every step. The NumPy
// references (tests/reference/policy_keepset_test.py) recompute the keep-sets from those inputs.
//
//   kvlab_policy_trace POLICY [KEY=VALUE ...] [--layers L] [--heads H] [--kv-heads K]
//                      [--dim D] [--prompt N] [--chunk C] [--decode M] [--seed S]
// The prompt is fed in chunks of C (default: one chunk), the last one marked prompt_end, then
// M one-token decode steps.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "framework/core/tool_main.h"
#include "policies/builtin.h"
#include "policies/policy_testing.h"

namespace kvlab {
namespace {

void print_floats(const std::vector<float>& x) {
  std::printf("[");
  for (size_t i = 0; i < x.size(); ++i) std::printf("%s%.9g", i ? "," : "", double(x[i]));
  std::printf("]");
}

int run(int argc, char** argv) {
  if (argc < 2) fail("usage: kvlab_policy_trace POLICY [KEY=VALUE ...] [--layers L] ...");
  const std::string name = argv[1];
  std::map<std::string, ParamValue> raw;
  testing::SimOptions o;
  o.n_layers = 2, o.n_heads = 4, o.n_kv_heads = 2, o.head_dim = 8;
  int prompt = 40, chunk = 0, decode = 0;
  uint64_t seed = 1;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> long long {
      if (i + 1 >= argc) fail(a, " needs a value");
      return std::stoll(argv[++i]);
    };
    if (a == "--layers") o.n_layers = int(next());
    else if (a == "--heads") o.n_heads = int(next());
    else if (a == "--kv-heads") o.n_kv_heads = int(next());
    else if (a == "--dim") o.head_dim = int(next());
    else if (a == "--prompt") prompt = int(next());
    else if (a == "--chunk") chunk = int(next());
    else if (a == "--decode") decode = int(next());
    else if (a == "--seed") seed = uint64_t(next());
    else if (const size_t eq = a.find('='); eq != std::string::npos) raw[a.substr(0, eq)] = parse_param_text(a.substr(eq + 1));
    else fail("unknown argument '", a, "'");
  }
  if (chunk <= 0) chunk = prompt;
  const PolicyRegistry registry = make_builtin_registry();
  testing::PolicySimulator sim(o, seed);
  auto policy = registry.create(name, raw, sim.shape(), "arguments");
  std::vector<int> schedule;
  for (int done = 0; done < prompt; done += chunk) schedule.push_back(std::min(chunk, prompt - done));
  const size_t prompt_steps = schedule.size();
  for (int i = 0; i < decode; ++i) schedule.push_back(1);
  const int total = prompt + decode;

  std::printf("{\"policy\":\"%s\",\"layers\":%d,\"heads\":%d,\"kv_heads\":%d,\"dim\":%d,"
              "\"prompt\":%d,\"chunk\":%d,\"decode\":%d,\"seed\":%llu,\n\"q\":[",
              name.c_str(), o.n_layers, o.n_heads, o.n_kv_heads, o.head_dim, prompt, chunk, decode,
              (unsigned long long)seed);
  for (int kind = 0; kind < 2; ++kind) {
    if (kind == 1) std::printf("],\n\"k\":[");
    for (int l = 0; l < o.n_layers; ++l) {
      std::printf("%s[", l ? "," : "");
      for (int p = 0; p < total; ++p) {
        std::vector<float> x(size_t(kind == 0 ? o.n_heads : o.n_kv_heads) * o.head_dim);
        testing::generate(o, seed, l, p, kind, x.data());
        if (p) std::printf(",");
        print_floats(x);
      }
      std::printf("]");
    }
  }
  std::printf("],\n\"steps\":[");
  for (size_t s = 0; s < schedule.size(); ++s) {
    const auto step = sim.step(*policy, schedule[s], s + 1 == prompt_steps);
    if (!step.violations.empty()) fail("contract violation: ", step.violations.front());
    std::printf("%s{\"n_seen\":%lld,\"kept\":[", s ? ",\n" : "", (long long)sim.n_seen());
    for (int l = 0; l < o.n_layers; ++l) {
      std::printf("%s[", l ? "," : "");
      const testing::FakeLayerCache& c = sim.cache(l);
      for (int h = 0; h < o.n_kv_heads; ++h) {
        std::printf("%s[", h ? "," : "");
        bool first = true;
        for (int slot = 0; slot < c.n_slots(); ++slot)
          if (c.slot_valid(slot, h)) {
            std::printf("%s%lld", first ? "" : ",", (long long)c.slot_position(slot, h));
            first = false;
          }
        std::printf("]");
      }
      std::printf("]");
    }
    std::printf("]}");
  }
  std::printf("]}\n");
  return 0;
}

}  // namespace
}  // namespace kvlab

int main(int argc, char** argv) { return kvlab::tool_main("kvlab_policy_trace", kvlab::run, argc, argv); }
