#include "framework/experiment/experiment.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <new>
#include <set>
#include <sstream>

#include "framework/core/error.h"
#include "framework/model/model_registry.h"
#include "framework/core/strings.h"
#include "framework/policy/policy.h"
#include "kernels/common/kv_format.h"

namespace kvlab {

std::string SourceRef::str() const {
  std::string out = file;
  if (line > 0) out += str_cat(":", line, ":", column);
  if (!key_path.empty()) out += ": " + key_path;
  return out;
}


uint64_t parse_byte_size(const std::string& text, const std::string& what) {
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(begin, &end);
  if (end == begin || errno != 0 || value < 0 || !std::isfinite(value))
    fail(what, ": expected a byte size such as 4096, \"64MiB\" or \"2GB\", got '", text, "'");
  std::string unit(end);
  unit.erase(std::remove(unit.begin(), unit.end(), ' '), unit.end());
  static const std::vector<std::pair<std::string, double>> kUnits = {
      {"", 1},          {"B", 1},           {"KB", 1e3},         {"MB", 1e6},
      {"GB", 1e9},      {"KiB", 1024.0},    {"MiB", 1048576.0},  {"GiB", 1073741824.0},
      {"K", 1024.0},    {"M", 1048576.0},   {"G", 1073741824.0}};
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    if (!(value * scale < 0x1p63)) fail(what, ": byte size '", text, "' is too large (at most 2^63 - 1 bytes)");
    return static_cast<uint64_t>(std::llround(value * scale));
  }
  fail(what, ": unknown size unit '", unit, "' (expected B, KB, MB, GB, KiB, MiB or GiB)");
}

namespace {

namespace fs = std::filesystem;

// Typed access to a YAML tree that names file, line, column and key path in every error.
class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}

  SourceRef ref(const YAML::Node& node, const std::string& path) const {
    SourceRef r{file_, 0, 0, path};
    if (node.IsDefined() && node.Mark().line >= 0) {
      r.line = node.Mark().line + 1;
      r.column = node.Mark().column + 1;
    }
    return r;
  }

  template <class... Parts>
  [[noreturn]] void error(const YAML::Node& node, const std::string& path, Parts&&... parts) const {
    fail(ref(node, path).str(), ": ", std::forward<Parts>(parts)...);
  }

  static std::string describe(const YAML::Node& node) {
    if (node.IsNull()) return "nothing";
    if (node.IsSequence()) return "a list";
    if (node.IsMap()) return "a mapping";
    return "'" + node.Scalar() + "'";
  }

  // Checks that `node` is a mapping whose keys are all in `allowed` (no duplicates) and that
  // every key of `required` is present.
  void expect_map(const YAML::Node& node, const std::string& path,
                  const std::vector<std::string>& allowed,
                  const std::vector<std::string>& required = {}) const {
    if (!node.IsMap())
      error(node, path, "expected a mapping with keys ", join(allowed), ", got ", describe(node));
    std::set<std::string> seen;
    for (auto it = node.begin(); it != node.end(); ++it) {
      const std::string key = it->first.Scalar();
      const std::string key_path = path.empty() ? key : path + "." + key;
      if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
        const std::string near = nearest_name(key, allowed);
        if (!near.empty())
          error(it->first, key_path, "unknown key '", key, "' (did you mean '", near, "'?)");
        error(it->first, key_path, "unknown key '", key, "'; expected one of ", join(allowed));
      }
      if (!seen.insert(key).second) error(it->first, key_path, "duplicate key '", key, "'");
    }
    for (const auto& key : required)
      if (!node[key])
        error(node, path, "missing required key '", key, "'");
  }

  std::string get_string(const YAML::Node& node, const std::string& path) const {
    if (!node.IsScalar()) error(node, path, "expected a string, got ", describe(node));
    return node.Scalar();
  }

  int64_t get_int(const YAML::Node& node, const std::string& path, int64_t min, int64_t max) const {
    if (!node.IsScalar()) error(node, path, "expected an integer, got ", describe(node));
    const std::string& s = node.Scalar();
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || errno != 0)
      error(node, path, "expected an integer, got '", s, "'");
    if (v < min || v > max)
      error(node, path, "expected an integer in [", min, ", ", max, "], got ", v);
    return v;
  }

  double get_number(const YAML::Node& node, const std::string& path, double min, double max) const {
    if (!node.IsScalar()) error(node, path, "expected a number, got ", describe(node));
    const std::string& s = node.Scalar();
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0' || !std::isfinite(v))
      error(node, path, "expected a number, got '", s, "'");
    if (v < min || v > max) error(node, path, "expected a number in [", min, ", ", max, "], got ", v);
    return v;
  }

  bool get_bool(const YAML::Node& node, const std::string& path) const {
    if (node.IsScalar()) {
      const std::string& s = node.Scalar();
      if (s == "true" || s == "True" || s == "yes") return true;
      if (s == "false" || s == "False" || s == "no") return false;
    }
    error(node, path, "expected true or false, got ", describe(node));
  }

  std::string get_choice(const YAML::Node& node, const std::string& path,
                         const std::vector<std::string>& choices) const {
    const std::string s = get_string(node, path);
    if (std::find(choices.begin(), choices.end(), s) != choices.end()) return s;
    const std::string near = nearest_name(s, choices);
    error(node, path, "expected one of ", join(choices, " | "), ", got '", s, "'",
          near.empty() ? "" : " (did you mean '" + near + "'?)");
  }

  // A scalar or a list of scalars -> list of nodes with their paths.
  std::vector<std::pair<YAML::Node, std::string>> one_or_list(const YAML::Node& node,
                                                              const std::string& path) const {
    std::vector<std::pair<YAML::Node, std::string>> out;
    if (node.IsSequence()) {
      if (node.size() == 0) error(node, path, "expected a non-empty list");
      for (size_t i = 0; i < node.size(); ++i)
        out.emplace_back(node[i], str_cat(path, "[", i, "]"));
    } else if (node.IsScalar()) {
      out.emplace_back(node, path);
    } else {
      error(node, path, "expected a value or a list of values, got ", describe(node));
    }
    return out;
  }

  // A scalar as a policy parameter: quoted scalars stay strings, plain ones are typed.
  ParamValue get_param(const YAML::Node& node, const std::string& path) const {
    if (!node.IsScalar())
      error(node, path, "expected a number, true/false or a string, got ", describe(node));
    if (node.Tag() == "!") return node.Scalar();  // quoted
    return parse_param_text(node.Scalar());
  }

  static std::string join(const std::vector<std::string>& items, const char* sep = ", ") {
    std::string out;
    for (const auto& s : items) out += (out.empty() ? "" : sep) + s;
    return out;
  }

 private:
  std::string file_;
};

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

void parse_model(const Reader& r, const YAML::Node& node, const fs::path& file, ModelSpec& m) {
  r.expect_map(node, "model", {"path", "dtype", "threads", "tokenizer"}, {"path"});
  const std::string text = r.get_string(node["path"], "model.path");
  m.path = resolve_path(text, file);
  // A registered short name (model_registry.h) when no such file exists.
  std::error_code ec;  // (no exception for a name longer than the file system allows)
  if (!fs::exists(m.path, ec) && looks_like_model_name(text))
    if (auto reg = find_registered_model(text)) m.path = reg->file;
  m.path_ref = r.ref(node["path"], "model.path");
  if (node["dtype"])
    m.dtype = r.get_choice(node["dtype"], "model.dtype", {"keep", "f32", "f16", "bf16", "q8_0"});
  if (node["threads"]) m.threads = int(r.get_int(node["threads"], "model.threads", 0, 1024));
  if (node["tokenizer"])
    m.tokenizer = resolve_path(r.get_string(node["tokenizer"], "model.tokenizer"), file);
}

void parse_kv(const Reader& r, const YAML::Node& node, KvSpec& kv) {
  r.expect_map(node, "kv", {"block_size", "budget_bytes", "format", "fp8_scale", "group_size", "residual"});
  if (node["format"]) {
    std::vector<std::string> names;
    for (KvFormat f : kAllKvFormats) names.push_back(kv_format_name(f));
    kv.format = r.get_choice(node["format"], "kv.format", names);
    kv.format_ref = r.ref(node["format"], "kv.format");
  }
  if (node["fp8_scale"]) kv.fp8_scale = r.get_number(node["fp8_scale"], "kv.fp8_scale", 1e-30, 1e30);
  if (node["group_size"]) kv.group_size = int(r.get_int(node["group_size"], "kv.group_size", 1, 4096));
  if (node["residual"]) kv.residual = int(r.get_int(node["residual"], "kv.residual", 0, 1 << 20));
  if (node["residual"] && kv.residual % kv.group_size != 0)
    r.error(node["residual"], "kv.residual", "must be a multiple of kv.group_size ", kv.group_size, ", got ", kv.residual);
  if (node["group_size"] && kv.block_size_tokens % kv.group_size != 0 && kv.group_size % kv.block_size_tokens != 0)
    r.error(node["group_size"], "kv.group_size", "must divide or be a multiple of kv.block_size ", kv.block_size_tokens,
            ", got ", kv.group_size);
  if (node["block_size"])
    kv.block_size_tokens = int(r.get_int(node["block_size"], "kv.block_size", 1, 4096));
  if (node["budget_bytes"]) {
    const YAML::Node& b = node["budget_bytes"];
    try {
      kv.budget_bytes = parse_byte_size(r.get_string(b, "kv.budget_bytes"), "kv.budget_bytes");
    } catch (const Error& e) {
      r.error(b, "kv.budget_bytes", "expected a byte size such as 4096, \"64MiB\" or \"2GB\", got ",
              Reader::describe(b));
    }
  }
}

void parse_engine(const Reader& r, const YAML::Node& node, EngineSpec& e) {
  r.expect_map(node, "engine", {"prefill_chunk", "probe", "probe_every", "probe_layers", "max_tokens"});
  if (node["max_tokens"])
    e.max_tokens = r.get_int(node["max_tokens"], "engine.max_tokens", 1, (int64_t{1} << 31) - 1);
  if (node["prefill_chunk"])
    e.prefill_chunk_tokens = int(r.get_int(node["prefill_chunk"], "engine.prefill_chunk", 1, 1 << 20));
  if (node["probe"]) e.probe = r.get_bool(node["probe"], "engine.probe");
  if (node["probe_every"])
    e.probe_every = int(r.get_int(node["probe_every"], "engine.probe_every", 1, 1 << 20));
  if (node["probe_layers"])
    for (const auto& [v, p] : r.one_or_list(node["probe_layers"], "engine.probe_layers"))
      e.probe_layers.push_back(int(r.get_int(v, p, 0, 1 << 16)));
}

void parse_policies(const Reader& r, const YAML::Node& node, std::vector<PolicyEntry>& out) {
  if (!node.IsSequence() || node.size() == 0)
    r.error(node, "policies", "expected a non-empty list of {name, type, params}, got ",
            Reader::describe(node));
  std::set<std::string> names;
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string path = str_cat("policies[", i, "]");
    const YAML::Node& p = node[i];
    r.expect_map(p, path, {"name", "type", "params"}, {"type"});
    PolicyEntry e;
    e.ref = r.ref(p, path);
    e.type = r.get_string(p["type"], path + ".type");
    e.type_ref = r.ref(p["type"], path + ".type");
    e.name = p["name"] ? r.get_string(p["name"], path + ".name") : e.type;
    if (e.name.empty() || e.name.find_first_of("/@,.") != std::string::npos)
      r.error(p["name"] ? p["name"] : p, path + ".name",
              "expected a non-empty name without '/', '@', ',' or '.', got '", e.name, "'");
    if (!names.insert(e.name).second)
      r.error(p["name"] ? p["name"] : p, path + ".name", "duplicate policy name '", e.name,
              "' (give each entry its own name:)");
    if (const YAML::Node params = p["params"]) {
      e.params_ref = r.ref(params, path + ".params");
      if (params.IsNull()) {
      } else if (!params.IsMap()) {
        r.error(params, path + ".params", "expected a mapping of parameter: value, got ",
                Reader::describe(params));
      } else {
        for (auto it = params.begin(); it != params.end(); ++it) {
          const std::string key = it->first.Scalar();
          const std::string kp = path + ".params." + key;
          for (const auto& [k, v] : e.params)
            if (k == key) r.error(it->first, kp, "duplicate key '", key, "'");
          std::vector<ParamValue> values;
          for (const auto& [n, np] : r.one_or_list(it->second, kp)) values.push_back(r.get_param(n, np));
          e.params.emplace_back(key, std::move(values));
        }
      }
    }
    out.push_back(std::move(e));
  }
}

void parse_niah(const Reader& r, const YAML::Node& node, const fs::path& file, NiahSpec& n) {
  const std::string path = "evals.niah";
  r.expect_map(node, path,
               {"haystack", "context_lengths", "depths", "trials", "needle", "question",
                "value_digits", "needle_placement", "max_answer_tokens", "decode_tail_tokens",
                "protocol"},
               {"haystack", "context_lengths", "depths"});
  n.enabled = true;
  n.ref = r.ref(node, path);
  n.haystack = read_paths(r, node["haystack"], path + ".haystack", file);
  for (const auto& [v, p] : r.one_or_list(node["context_lengths"], path + ".context_lengths"))
    n.context_lengths.push_back(int(r.get_int(v, p, 16, 1 << 24)));
  for (const auto& [v, p] : r.one_or_list(node["depths"], path + ".depths"))
    n.depths.push_back(r.get_number(v, p, 0, 100));
  if (node["trials"]) n.trials = int(r.get_int(node["trials"], path + ".trials", 1, 100000));
  if (node["needle"]) {
    n.needle = r.get_string(node["needle"], path + ".needle");
    if (n.needle.find("{value}") == std::string::npos)
      r.error(node["needle"], path + ".needle", "expected a sentence containing '{value}', got '",
              n.needle, "'");
  }
  if (node["question"]) n.question = r.get_string(node["question"], path + ".question");
  if (node["value_digits"])
    n.value_digits = int(r.get_int(node["value_digits"], path + ".value_digits", 1, 18));
  if (node["needle_placement"])
    n.needle_placement = r.get_choice(node["needle_placement"], path + ".needle_placement",
                                      {"nearest", "previous"}) == "nearest"
                             ? NeedlePlacement::kNearest
                             : NeedlePlacement::kPrevious;
  if (node["max_answer_tokens"])
    n.max_answer_tokens = int(r.get_int(node["max_answer_tokens"], path + ".max_answer_tokens", 1, 4096));
  if (const YAML::Node t = node["decode_tail_tokens"]) {
    if (t.IsScalar() && t.Scalar() == "question")
      n.decode_tail_tokens = -1;
    else
      n.decode_tail_tokens = int(r.get_int(t, path + ".decode_tail_tokens", 0, 1 << 20));
  }
  if (node["protocol"]) {
    const std::string p = r.get_choice(node["protocol"], path + ".protocol",
                                       {"decode_tail", "query_agnostic", "query_aware"});
    n.protocol = p == "query_aware"      ? NiahProtocol::kQueryAware
                 : p == "query_agnostic" ? NiahProtocol::kQueryAgnostic
                                         : NiahProtocol::kDecodeTail;
    if (node["decode_tail_tokens"] && n.protocol != NiahProtocol::kDecodeTail)
      r.error(node["decode_tail_tokens"], path + ".decode_tail_tokens",
              "decode_tail_tokens applies to protocol decode_tail only, not ", p);
  }
}

void parse_perplexity(const Reader& r, const YAML::Node& node, const fs::path& file,
                      PerplexitySpec& s) {
  const std::string path = "evals.perplexity";
  r.expect_map(node, path,
               {"text", "tokens", "protocol", "n_ctx", "window", "stride", "checkpoints"},
               {"text"});
  s.enabled = true;
  s.ref = r.ref(node, path);
  s.text = read_paths(r, node["text"], path + ".text", file);
  if (node["tokens"]) s.tokens = int(r.get_int(node["tokens"], path + ".tokens", 2, 1 << 26));
  if (node["protocol"]) {
    const std::string p =
        r.get_choice(node["protocol"], path + ".protocol", {"streaming", "chunked", "sliding"});
    s.protocol = p == "streaming" ? PplProtocol::kStreaming
                 : p == "chunked" ? PplProtocol::kChunked
                                  : PplProtocol::kSliding;
  }
  if (node["n_ctx"]) s.n_ctx = int(r.get_int(node["n_ctx"], path + ".n_ctx", 4, 1 << 24));
  if (node["window"]) s.window = int(r.get_int(node["window"], path + ".window", 2, 1 << 24));
  if (node["stride"]) s.stride = int(r.get_int(node["stride"], path + ".stride", 1, 1 << 24));
  if (s.protocol == PplProtocol::kChunked && s.tokens < 2 * s.n_ctx)
    r.error(node["tokens"] ? node["tokens"] : node, path + ".tokens",
            "the chunked protocol needs tokens >= 2 * n_ctx (", 2 * s.n_ctx, "), got ", s.tokens);
  if (s.protocol == PplProtocol::kSliding && s.stride > s.window)
    r.error(node["stride"], path + ".stride", "expected stride <= window (", s.window, "), got ",
            s.stride);
  if (node["checkpoints"]) {
    for (const auto& [v, p] : r.one_or_list(node["checkpoints"], path + ".checkpoints"))
      s.checkpoints.push_back(int(r.get_int(v, p, 1, 1 << 26)));
    if (!std::is_sorted(s.checkpoints.begin(), s.checkpoints.end()))
      r.error(node["checkpoints"], path + ".checkpoints", "expected increasing token counts");
  }
}

}  // namespace

ExperimentSpec parse_experiment_text(const std::string& text, const fs::path& file) {
  const std::string fname = file.string();
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    fail(fname, ":", e.mark.line + 1, ":", e.mark.column + 1, ": invalid YAML: ", e.msg);
  }
  Reader r(fname);
  ExperimentSpec spec;
  spec.file = file;
  spec.yaml_text = text;
  r.expect_map(root, "",
               {"name", "model", "kv", "engine", "policies", "plugins", "seeds", "output", "evals",
                "max_cells"},
               {"model", "policies", "evals"});
  if (root["max_cells"]) {
    spec.max_cells = uint64_t(r.get_int(root["max_cells"], "max_cells", 1, int64_t(kMaxCellsLimit)));
    spec.max_cells_ref = r.ref(root["max_cells"], "max_cells");
  }
  spec.name = root["name"] ? r.get_string(root["name"], "name") : file.stem().string();
  parse_model(r, root["model"], file, spec.model);
  if (root["kv"]) parse_kv(r, root["kv"], spec.kv);
  if (root["engine"]) parse_engine(r, root["engine"], spec.engine);
  parse_policies(r, root["policies"], spec.policies);
  if (root["plugins"]) spec.plugins = read_paths(r, root["plugins"], "plugins", file);
  if (root["seeds"]) {
    spec.seeds.clear();
    for (const auto& [v, p] : r.one_or_list(root["seeds"], "seeds"))
      spec.seeds.push_back(uint64_t(r.get_int(v, p, 0, INT64_MAX)));
  }
  spec.output = root["output"] ? fs::path(r.get_string(root["output"], "output"))
                               : fs::path("results") / (spec.name + ".h5");
  const YAML::Node evals = root["evals"];
  r.expect_map(evals, "evals", {"niah", "perplexity"});
  if (evals.size() == 0) r.error(evals, "evals", "expected at least one of niah, perplexity");
  if (evals["niah"]) parse_niah(r, evals["niah"], file, spec.niah);
  if (evals["perplexity"]) parse_perplexity(r, evals["perplexity"], file, spec.perplexity);
  check_grid_size(spec);
  return spec;
}

namespace {

uint64_t saturating_mul(uint64_t a, uint64_t b) {
  uint64_t out;
  return __builtin_mul_overflow(a, b, &out) ? UINT64_MAX : out;
}
uint64_t saturating_add(uint64_t a, uint64_t b) {
  uint64_t out;
  return __builtin_add_overflow(a, b, &out) ? UINT64_MAX : out;
}
uint64_t entry_runs(const PolicyEntry& e) {
  uint64_t n = 1;
  for (const auto& [key, values] : e.params) n = saturating_mul(n, values.size());
  return n;
}

}  // namespace

GridCount count_grid(const ExperimentSpec& spec) {
  GridCount g;
  for (const PolicyEntry& e : spec.policies) g.runs = saturating_add(g.runs, entry_runs(e));
  if (spec.niah.enabled)
    g.cells_per_run = saturating_mul(spec.niah.context_lengths.size(), spec.niah.depths.size());
  if (spec.perplexity.enabled) g.cells_per_run = saturating_add(g.cells_per_run, spec.perplexity.text.size());
  g.cells = saturating_mul(g.runs, g.cells_per_run);
  return g;
}

void check_grid_size(const ExperimentSpec& spec) {
  const GridCount g = count_grid(spec);
  if (g.cells <= spec.max_cells) return;
  // Name the entry whose lists multiply most, or the evals when the runs alone are few.
  const PolicyEntry* widest = nullptr;
  for (const PolicyEntry& e : spec.policies)
    if (!widest || entry_runs(e) > entry_runs(*widest)) widest = &e;
  std::string where;
  if (widest && entry_runs(*widest) > 1 && entry_runs(*widest) >= g.cells_per_run) {
    SourceRef ref = widest->params_ref;
    where = ref.str();
  } else {
    const SourceRef& ref = spec.niah.enabled ? spec.niah.ref : spec.perplexity.ref;
    where = ref.str();
  }
  auto count = [](uint64_t n) { return n == UINT64_MAX ? std::string("more than 2^64") : std::to_string(n); };
  fail(where, ": the experiment expands to ", count(g.runs), " runs x ", count(g.cells_per_run),
       " cells per run = ", count(g.cells), " cells, above max_cells = ", spec.max_cells,
       spec.max_cells_ref.file.empty() ? " (the default; set max_cells: N at the top level of the file to allow more"
                                       : " (set at " + spec.max_cells_ref.str(),
       "; cells are counted before any is built)");
}

ExperimentSpec parse_experiment(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail(file.string(), ": cannot read the experiment file");
  std::ostringstream text;
  text << in.rdbuf();
  try {
    return parse_experiment_text(text.str(), file);
  } catch (const std::bad_alloc&) {
    fail(file.string(), ": out of memory while reading the experiment file");
  }
}

void check_files_exist(const ExperimentSpec& spec) {
  auto check = [&](const fs::path& p, const std::string& key) {
    std::error_code ec;
    if (fs::exists(p, ec)) return;
    if (ec && ec != std::errc::no_such_file_or_directory)
      fail(spec.file.string(), ": ", key, ": cannot access ", p.string(), ": ", ec.message());
    if (p.is_absolute()) fail(spec.file.string(), ": ", key, ": file not found: ", p.string());
    // Relative: looked up in the current directory, then beside the YAML (one place when
    // they are the same directory).
    const fs::path here = fs::absolute(p).lexically_normal();
    const fs::path beside = fs::absolute(spec.file.parent_path() / p).lexically_normal();
    if (here == beside) fail(spec.file.string(), ": ", key, ": file not found: ", p.string(), " (", here.string(), ")");
    fail(spec.file.string(), ": ", key, ": file not found: ", p.string(), " (tried ", here.string(),
         " and, beside the experiment file, ", beside.string(), ")");
  };
  std::error_code model_ec;
  if (!fs::exists(spec.model.path, model_ec) && looks_like_model_name(spec.model.path.string()))
    resolve_model_path(spec.model.path.string(), spec.file.string() + ": model.path");  // names the registry
  check(spec.model.path, "model.path");
  if (!spec.model.tokenizer.empty()) check(spec.model.tokenizer, "model.tokenizer");
  for (size_t i = 0; i < spec.plugins.size(); ++i) check(spec.plugins[i], str_cat("plugins[", i, "]"));
  for (size_t i = 0; i < spec.niah.haystack.size(); ++i)
    check(spec.niah.haystack[i], str_cat("evals.niah.haystack[", i, "]"));
  for (size_t i = 0; i < spec.perplexity.text.size(); ++i)
    check(spec.perplexity.text[i], str_cat("evals.perplexity.text[", i, "]"));
}

void check_policies(const ExperimentSpec& spec, const PolicyLookup& lookup) {
  for (const PolicyEntry& e : spec.policies) {
    const PolicyFactory* factory = lookup.find(e.type);
    if (!factory) {
      const std::vector<std::string> known = lookup.known_types();
      const std::string near = nearest_name(e.type, known);
      std::string all;
      for (const auto& k : known) all += (all.empty() ? "" : ", ") + k;
      fail(e.type_ref.str(), ": unknown policy type '", e.type, "'",
           near.empty() ? "" : " (did you mean '" + near + "'?)", "; registered: ", all);
    }
    // Every grid value is checked on its own (validate_params checks keys, types and ranges).
    for (const auto& [key, values] : e.params)
      for (const ParamValue& v : values)
        validate_params(e.type, factory->params(), {{key, v}},
                        e.params_ref.file + ":" + std::to_string(e.params_ref.line) + ":" +
                            std::to_string(e.params_ref.column) + ": " + e.params_ref.key_path);
  }
}

}  // namespace kvlab
