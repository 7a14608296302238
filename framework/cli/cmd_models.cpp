// kvlab models: the models that scripts/setup_models.sh registered (model_registry.h), one row
// each: short name, architecture, quantisation (as shipped -> as stored), context length,
// licence, whether the file is present, and the file. `--model NAME` and `model.path: NAME`
// accept the names. --json prints one JSON array instead.
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "framework/cli/options.h"
#include "framework/model/model_registry.h"

namespace kvlab::cli {

int run_models(const std::vector<std::string>& args) {
  po::options_description desc("options");
  desc.add_options()("json", "print one JSON array instead of the table");
  po::variables_map vm;
  if (!parse_options(args, "kvlab models [--json]   (directory: $KVLAB_MODELS_DIR, else <source>/.models)",
                     desc, {}, vm))
    return 0;
  const std::filesystem::path dir = models_dir();
  const std::vector<RegisteredModel> models = read_models_index(dir);
  if (vm.count("json")) {
    nlohmann::json out = nlohmann::json::array();
    for (const RegisteredModel& m : models)
      out.push_back({{"name", m.name}, {"file", m.file.string()}, {"architecture", m.architecture},
                     {"source_quantization", m.source_quantization}, {"stored_dtype", m.stored_dtype},
                     {"context_length", m.context_length}, {"license", m.license}, {"source", m.source},
                     {"present", std::filesystem::exists(m.file)}});
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("models registered in %s:\n", (dir / "index.tsv").string().c_str());
  if (models.empty()) {
    std::printf("  none (scripts/setup_models.sh installs smollm2-135m and gemma3-270m)\n");
    return 0;
  }
  std::printf("  %-16s %-13s %-22s %-8s %-12s %-8s %s\n", "name", "architecture", "quantisation", "context",
              "licence", "present", "file");
  for (const RegisteredModel& m : models) {
    const std::string quant = m.source_quantization + " -> " + m.stored_dtype;
    std::printf("  %-16s %-13s %-22s %-8s %-12s %-8s %s\n", m.name.c_str(), m.architecture.c_str(),
                quant.c_str(), m.context_length.c_str(), m.license.c_str(),
                std::filesystem::exists(m.file) ? "yes" : "MISSING", m.file.string().c_str());
  }
  return 0;
}

}  // namespace kvlab::cli
