#include "framework/experiment/yaml_reader.h"

#include <fstream>
#include <sstream>

namespace kvlab {

namespace fs = std::filesystem;

std::string SourceRef::str() const {
  std::string out = file;
  if (line > 0) out += str_cat(":", line, ":", column);
  if (!key_path.empty()) out += ": " + key_path;
  return out;
}


// (std::filesystem::exists without an error_code throws for a name longer than the file system
// allows; such a path simply does not exist here, and check_files_exist names it.)
fs::path resolve_path(const std::string& text, const fs::path& yaml_file) {
  fs::path p(text);
  std::error_code ec;
  if (p.is_absolute() || fs::exists(p, ec)) return p;
  const fs::path beside = yaml_file.parent_path() / p;
  if (fs::exists(beside, ec)) return beside;
  return p;
}

std::vector<fs::path> read_paths(const Reader& r, const YAML::Node& node, const std::string& path,
                                 const fs::path& yaml_file) {
  std::vector<fs::path> out;
  for (const auto& [n, p] : r.one_or_list(node, path))
    out.push_back(resolve_path(r.get_string(n, p), yaml_file));
  return out;
}

std::string read_text_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail(p.string(), ": cannot read");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace kvlab
