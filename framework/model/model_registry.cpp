#include "framework/model/model_registry.h"

#include <cstdlib>
#include <fstream>
#include <set>

#include "framework/core/error.h"
#include "framework/core/strings.h"

namespace fs = std::filesystem;

namespace kvlab {

namespace {

constexpr const char* kHeader[] = {"name",   "file",           "architecture", "source_quantization",
                                   "stored_dtype", "context_length", "license",      "source"};
constexpr size_t kFields = sizeof(kHeader) / sizeof(kHeader[0]);

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out(1);
  for (char c : line) {
    if (c == '\t') out.emplace_back();
    else out.back() += c;
  }
  return out;
}

std::string registered_names(const std::vector<RegisteredModel>& models) {
  std::string out;
  for (const auto& m : models) out += (out.empty() ? "" : ", ") + m.name;
  return out.empty() ? "none" : out;
}

}  // namespace

fs::path models_dir() {
  if (const char* env = std::getenv("KVLAB_MODELS_DIR"); env != nullptr && *env != '\0') return env;
  return fs::path(KVLAB_SOURCE_DIR) / ".models";
}

std::vector<RegisteredModel> read_models_index(const fs::path& dir) {
  const fs::path path = dir / "index.tsv";
  std::ifstream in(path);
  if (!in) {
    if (fs::exists(path)) fail(path.string(), ": cannot be read");
    return {};
  }
  std::vector<RegisteredModel> out;
  std::set<std::string> seen;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const std::vector<std::string> f = split_tabs(line);
    if (line_no == 1) {
      bool ok = f.size() == kFields;
      for (size_t i = 0; ok && i < kFields; ++i) ok = f[i] == kHeader[i];
      if (!ok) fail(path.string(), ":1: expected the header 'name<TAB>file<TAB>architecture<TAB>...' "
                    "(scripts/models/kvlab_models.py writes it)");
      continue;
    }
    if (line.empty()) continue;
    if (f.size() != kFields)
      fail(path.string(), ":", line_no, ": expected ", kFields, " tab-separated fields, got ", f.size());
    if (f[0].empty() || f[1].empty()) fail(path.string(), ":", line_no, ": empty name or file");
    if (!seen.insert(f[0]).second) fail(path.string(), ":", line_no, ": model '", f[0], "' is registered twice");
    RegisteredModel m{f[0], fs::path(f[1]), f[2], f[3], f[4], f[5], f[6], f[7]};
    if (m.file.is_relative()) m.file = dir / m.file;
    out.push_back(std::move(m));
  }
  return out;
}

bool looks_like_model_name(const std::string& text) {
  if (text.empty() || text.size() > 128) return false;
  for (char c : text) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  for (const char* ext : {".gguf", ".bin", ".safetensors", ".json"}) {
    const std::string e = ext;
    if (text.size() >= e.size() && text.compare(text.size() - e.size(), e.size(), e) == 0) return false;
  }
  return text != "." && text != "..";
}

std::optional<RegisteredModel> find_registered_model(const std::string& name) {
  for (RegisteredModel& m : read_models_index(models_dir()))
    if (m.name == name) return std::move(m);
  return std::nullopt;
}

fs::path resolve_model_path(const std::string& text, const std::string& what) {
  std::error_code ec;  // (no exception for a name longer than the file system allows)
  if (fs::exists(text, ec) || !looks_like_model_name(text)) return text;
  const fs::path dir = models_dir();
  const std::vector<RegisteredModel> models = read_models_index(dir);
  for (const RegisteredModel& m : models) {
    if (m.name != text) continue;
    if (!fs::exists(m.file, ec))
      fail(what, ": model '", text, "' is registered in ", (dir / "index.tsv").string(), " but its file ",
           m.file.string(), " is missing (rerun scripts/setup_models.sh)");
    return m.file;
  }
  fail(what, ": '", text, "' is neither a file nor a registered model (registered in ",
       (dir / "index.tsv").string(), ": ", registered_names(models),
       "; scripts/setup_models.sh installs smollm2-135m and gemma3-270m)");
}

}  // namespace kvlab
