// Registered models: short names (`smollm2-135m`) for model files that scripts/setup_models.sh
// installed, so that `--model NAME` and `model.path: NAME` work wherever a path does.
//
// The registry is one file, DIR/index.tsv, where DIR is $KVLAB_MODELS_DIR or, when unset,
// <source tree>/.models (git-ignored). Its first line is the header below; each further line
// is one model, tab-separated:
//   name  file  architecture  source_quantization  stored_dtype  context_length  license  source
// `file` is relative to DIR unless absolute. scripts/models/kvlab_models.py writes it.
//
// Resolution (resolve_model_path): an existing path always wins; otherwise a registered name
// gives its file; otherwise a string that looks like a name (no '/', no file extension) is an
// error listing the registered names; anything else is returned as given, so the loader reports
// the missing file as before.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace kvlab {

struct RegisteredModel {
  std::string name;
  std::filesystem::path file;  // absolute or relative to the current directory
  std::string architecture;
  std::string source_quantization;
  std::string stored_dtype;
  std::string context_length;
  std::string license;
  std::string source;
};

// $KVLAB_MODELS_DIR, else <source tree>/.models.
std::filesystem::path models_dir();

// Every model in DIR/index.tsv; empty when the file does not exist. Throws kvlab::Error naming
// the file and line for a bad header, a wrong field count or a duplicate name.
std::vector<RegisteredModel> read_models_index(const std::filesystem::path& dir);

// True for strings that can only be a registered name: [A-Za-z0-9_-] and dots, no '/', not
// ending in a model-file extension (.gguf, .bin, .safetensors, .json).
bool looks_like_model_name(const std::string& text);

// The registered model called `name` in models_dir(), if any.
std::optional<RegisteredModel> find_registered_model(const std::string& name);

// See the header comment. `what` names the option or key in errors ("--model", "model.path").
std::filesystem::path resolve_model_path(const std::string& text, const std::string& what);

}  // namespace kvlab
