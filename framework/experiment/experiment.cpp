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
    m.dtype = r.get_choice(node["dtype"], "model.dtype", {"keep", "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"});
  if (node["threads"]) m.threads = int(r.get_int(node["threads"], "model.threads", 0, 1024));
  if (node["tokenizer"])
    m.tokenizer = resolve_path(r.get_string(node["tokenizer"], "model.tokenizer"), file);
}

void parse_kv(const Reader& r, const YAML::Node& node, KvSpec& kv) {
  r.expect_map(node, "kv", {"block_size", "block_tables", "budget_bytes", "format", "fp8_scale", "group_size", "residual"});
  if (node["format"]) {
    std::vector<std::string> names;
    for (KvFormat f : kAllKvFormats) names.push_back(kv_format_name(f));
    kv.formats.clear();
    for (const auto& [n, path] : r.one_or_list(node["format"], "kv.format")) {
      const std::string f = r.get_choice(n, path, names);
      if (std::find(kv.formats.begin(), kv.formats.end(), f) != kv.formats.end())
        r.error(n, path, "format '", f, "' is listed twice");
      kv.formats.push_back(f);
    }
    kv.format_ref = r.ref(node["format"], "kv.format");
  }
  if (const YAML::Node scale = node["fp8_scale"]) {  // a number, or "prompt"
    const std::string word = scale.IsScalar() ? scale.Scalar() : std::string();
    char* end = nullptr;
    const bool number = !word.empty() && (std::strtod(word.c_str(), &end), *end == '\0');
    if (word == "prompt")
      kv.fp8_scale_from_prompt = true;
    else if (scale.IsScalar() && !number)
      r.error(scale, "kv.fp8_scale", "expected a positive number or 'prompt', got '", word, "'");
    else
      kv.fp8_scale = r.get_number(scale, "kv.fp8_scale", 1e-30, 1e30);
  }
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
  if (node["block_tables"]) {
    kv.per_head_tables = r.get_choice(node["block_tables"], "kv.block_tables", {"per_layer", "per_head"}) == "per_head";
    for (const std::string& f : kv.formats)
      if (kv.per_head_tables && (f == "int4" || f == "int2"))
        r.error(node["block_tables"], "kv.block_tables", "per_head cannot hold kv.format ", f,
                " (KIVI's quantised rows never move, so a head's holes are never compacted); use per_layer");
  }
}

void parse_engine(const Reader& r, const YAML::Node& node, EngineSpec& e) {
  r.expect_map(node, "engine", {"prefill_chunk", "probe", "probe_every", "probe_layers", "max_tokens", "prefix_reuse"});
  if (node["prefix_reuse"]) e.prefix_reuse = r.get_bool(node["prefix_reuse"], "engine.prefix_reuse");
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

// zip: [a, b] (one group) or [[a, b], [c, d]]: each group's lists step together. Fills e.axes:
// one axis per group and per parameter in no group, ordered by their first parameter.
void parse_zip(const Reader& r, const YAML::Node& node, const std::string& path, PolicyEntry& e) {
  std::vector<int> group_of(e.params.size(), -1);
  std::vector<std::vector<size_t>> groups;
  if (node) {
    if (!node.IsSequence() || node.size() == 0)
      r.error(node, path, "expected a list of parameter names ([a, b]) or of such lists, got ", Reader::describe(node));
    const bool nested = node[0].IsSequence();
    std::vector<std::pair<YAML::Node, std::string>> group_nodes;
    if (nested)
      for (size_t g = 0; g < node.size(); ++g) group_nodes.emplace_back(node[g], str_cat(path, "[", g, "]"));
    else
      group_nodes.emplace_back(node, path);
    std::vector<std::string> names;
    for (const auto& [k, v] : e.params) names.push_back(k);
    for (const auto& [g, gp] : group_nodes) {
      if (!g.IsSequence() || g.size() < 2)
        r.error(g, gp, "expected a list of at least two parameter names that step together, got ", Reader::describe(g));
      std::vector<size_t> group;
      for (size_t i = 0; i < g.size(); ++i) {
        const std::string kp = str_cat(gp, "[", i, "]");
        const std::string key = r.get_string(g[i], kp);
        const auto it = std::find(names.begin(), names.end(), key);
        if (it == names.end()) {
          const std::string near = nearest_name(key, names);
          r.error(g[i], kp, "'", key, "' is not a parameter of this entry",
                  near.empty() ? "" : " (did you mean '" + near + "'?)", names.empty() ? "" : "; its params are " + Reader::join(names));
        }
        const size_t idx = size_t(it - names.begin());
        if (group_of[idx] >= 0) r.error(g[i], kp, "parameter '", key, "' is zipped twice");
        group_of[idx] = int(groups.size());
        group.push_back(idx);
      }
      // Every list of a group has the first one's length: name both and where each was written.
      const auto& [k0, v0] = e.params[group.front()];
      for (size_t i = 1; i < group.size(); ++i) {
        const auto& [ki, vi] = e.params[group[i]];
        if (vi.size() != v0.size())
          r.error(g[i], str_cat(gp, "[", i, "]"), "zipped parameters step together, so their lists need one length: '",
                  ki, "' has ", vi.size(), " value", vi.size() == 1 ? "" : "s", ", '", k0, "' has ", v0.size(),
                  " (", e.params_ref.key_path, ".", ki, " and .", k0, ")");
      }
      groups.push_back(std::move(group));
    }
  }
  std::vector<bool> placed(groups.size(), false);
  for (size_t i = 0; i < e.params.size(); ++i) {
    if (group_of[i] < 0) {
      e.axes.push_back({i});
    } else if (!placed[size_t(group_of[i])]) {
      placed[size_t(group_of[i])] = true;
      e.axes.push_back(groups[size_t(group_of[i])]);
    }
  }
}

void parse_policies(const Reader& r, const YAML::Node& node, std::vector<PolicyEntry>& out) {
  if (!node.IsSequence() || node.size() == 0)
    r.error(node, "policies", "expected a non-empty list of {name, type, params}, got ",
            Reader::describe(node));
  std::set<std::string> names;
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string path = str_cat("policies[", i, "]");
    const YAML::Node& p = node[i];
    r.expect_map(p, path, {"name", "type", "params", "zip"}, {"type"});
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
    parse_zip(r, p["zip"], path + ".zip", e);
    out.push_back(std::move(e));
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
  const EvaluationRegistry& registry = builtin_evaluations();
  const std::vector<std::string> names = registry.names();
  r.expect_map(evals, "evals", names);
  if (evals.size() == 0) r.error(evals, "evals", "expected at least one of ", Reader::join(names));
  for (const std::string& name : names)  // registry order: the cell order
    if (const YAML::Node section = evals[name])
      spec.evals.push_back(registry.find(name)->parse(EvalSection{r, section, "evals." + name, file}));
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
  for (const auto& axis : e.axes) n = saturating_mul(n, e.params[axis.front()].second.size());
  return n;
}

}  // namespace

const NiahSpec& niah_spec(const ExperimentSpec& spec) {
  static const NiahSpec kAbsent;
  const NiahEvaluation* e = find_evaluation<NiahEvaluation>(spec);
  return e ? e->spec() : kAbsent;
}

const PerplexitySpec& perplexity_spec(const ExperimentSpec& spec) {
  static const PerplexitySpec kAbsent;
  const PerplexityEvaluation* e = find_evaluation<PerplexityEvaluation>(spec);
  return e ? e->spec() : kAbsent;
}

GridCount count_grid(const ExperimentSpec& spec) {
  GridCount g;
  for (const PolicyEntry& e : spec.policies) g.runs = saturating_add(g.runs, entry_runs(e));
  g.runs = saturating_mul(g.runs, spec.kv.formats.size());
  for (const auto& e : spec.evals) g.cells_per_run = saturating_add(g.cells_per_run, e->cell_count());
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
    where = spec.evals.empty() ? spec.file.string() : spec.evals.front()->ref().str();
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
  for (const auto& e : spec.evals)
    for (const auto& [key, path] : e->input_files()) check(path, key);
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
