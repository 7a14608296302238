#include "framework/experiment/runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>

#include "evals/lm.h"
#include "evals/niah.h"
#include "evals/perplexity.h"
#include "framework/core/error.h"
#include "framework/engine/engine.h"
#include "framework/experiment/engine_lm.h"
#include "framework/experiment/progress.h"
#include "framework/experiment/report.h"
#include "framework/experiment/results.h"
#include "framework/experiment/sha256.h"
#include "framework/model/model.h"
#include "framework/policy/registry.h"
#include "kvlab/version.h"
#include "policies/builtin.h"

namespace kvlab {
namespace {

namespace fs = std::filesystem;

std::string model_config_json(const ModelConfig& c) {
  return str_cat("{\"arch\": \"", c.arch, "\", \"dim\": ", c.dim, ", \"n_layers\": ", c.n_layers,
                 ", \"n_heads\": ", c.n_heads, ", \"n_kv_heads\": ", c.n_kv_heads, ", \"head_dim\": ",
                 c.head_dim, ", \"hidden_dim\": ", c.hidden_dim, ", \"vocab_size\": ", c.vocab_size,
                 ", \"max_seq_len\": ", c.max_seq_len, ", \"rope_theta\": ", c.rope_theta,
                 ", \"rms_eps\": ", c.rms_eps,
                 // MLA: the ranks, and the f32 bytes per token of the latent cache against the
                 // equivalent per-head (MHA) cache
                 c.mla() ? str_cat(", \"q_lora_rank\": ", c.q_lora_rank, ", \"kv_lora_rank\": ", c.kv_lora_rank,
                                   ", \"qk_nope_head_dim\": ", c.qk_nope_head_dim, ", \"qk_rope_head_dim\": ",
                                   c.qk_rope_head_dim, ", \"v_head_dim\": ", c.v_head_dim,
                                   ", \"kv_bytes_per_token_f32\": ", c.kv_bytes_per_token(DType::kF32),
                                   ", \"mha_kv_bytes_per_token_f32\": ", c.mha_kv_bytes_per_token(DType::kF32))
                         : std::string(),
                 "}");
}

// Tokens a cell keeps in the KV store at most, summed over layers, per the policy's budget.
int64_t resident_token_layers(const AttentionPolicy& policy, const ModelConfig& c, int64_t n_seen) {
  int64_t sum = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    const int64_t b = policy.budget_tokens(l, n_seen);
    sum += b < 0 ? n_seen : std::min(b, n_seen);
  }
  return sum;
}

AttrValue param_attr(const ParamValue& v) {
  if (auto* b = std::get_if<bool>(&v)) return int64_t(*b);
  if (auto* i = std::get_if<int64_t>(&v)) return *i;
  if (auto* d = std::get_if<double>(&v)) return *d;
  return std::get<std::string>(v);
}

std::string attr_text(const AttrValue& v) {
  if (auto* s = std::get_if<std::string>(&v)) return *s;
  if (auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&v)) return str_cat(*d);
  return "[...]";
}

// "was 'trials: 1', now 'trials: 2'" for the first line that differs between two identities.
std::string first_difference(const std::string& before, const std::string& now) {
  std::istringstream a(before), b(now);
  std::string la, lb;
  while (true) {
    const bool ga = bool(std::getline(a, la)), gb = bool(std::getline(b, lb));
    if (!ga && !gb) return "identical";
    if (!ga) la = "(nothing)";
    if (!gb) lb = "(nothing)";
    if (la != lb) return "was '" + la + "', now '" + lb + "'";
    if (!ga || !gb) return "identical";
  }
}

// The store of one kv.format for this model (its bytes per token; the engine's store).
KvStoreConfig store_config(const ExperimentSpec& spec, const ModelConfig& c, const std::string& format) {
  KvStoreConfig kc{c.n_layers, c.n_kv_heads, c.head_dim, spec.kv.block_size_tokens, 0, KvFormat::kF32, 1.f,
                   spec.kv.group_size, spec.kv.residual};
  parse_kv_format(format, &kc.format);  // checked when parsed
  kc.values_alias_keys = c.mla();  // MLA's latent cache: one row per token (kv_store.h)
  kc.per_head_tables = spec.kv.per_head_tables;
  return kc;
}

void dry_run(const ExperimentSpec& spec, const std::vector<RunSpec>& runs,
             const std::vector<CellSpec>& cells, const RunOptions& o, const Model& model,
             const PolicyRegistry& registry, std::ostream& out) {
  const ModelConfig& c = model.config;
  for (const std::string& format : spec.kv.formats)
    out << "kv.format " << format << ": " << kv_bytes_per_token(store_config(spec, c, format))
        << " bytes per token (K and V, " << c.n_layers << " layers x " << c.n_kv_heads
        << " KV heads, metadata included)\n";
  char line[512];
  std::snprintf(line, sizeof line, "%6s  %-32s %-20s %10s %14s\n", "cell", "run", "eval", "tokens", "kv_est_MiB");
  out << line;
  int n = 0;
  for (const CellSpec& cell : cells) {
    if (!in_shard(cell, o.shard)) continue;
    ++n;
    const RunSpec& run = runs[cell.run];
    const int64_t tokens = spec.evals[cell.eval]->cell_tokens(cell.eval_cell);
    const auto policy = registry.create(run.type, run.params, policy_shape(c), "policies." + run.name + ".params");
    // Resident tokens rounded up to whole blocks per layer (the store's unit).
    const int64_t per_layer = resident_token_layers(*policy, c, tokens) / c.n_layers;
    const int64_t bs = spec.kv.block_size_tokens;
    const double bytes_per_token_layer = kv_bytes_per_token(store_config(spec, c, run.kv_format)) / c.n_layers;
    const double bytes = double((per_layer + bs - 1) / bs * bs) * bytes_per_token_layer * c.n_layers;
    std::snprintf(line, sizeof line, "%6d  %-32s %-20s %10lld %14.2f\n", cell.index, run.name.c_str(),
                  cell.id.c_str(), static_cast<long long>(tokens), bytes / 1048576.0);
    out << line;
  }
  out << n << " of " << cells.size() << " cells in shard " << o.shard.index << "/" << o.shard.count
      << " (KV estimate: the kv.format store, the policy's budget, whole blocks)\n";
}

}  // namespace

void check_device(Device device) {
  if (device == Device::kCuda && !cuda_device_available())
    fail("--device cuda: ", cuda_device_summary(), "; use --device cpu");
}

std::vector<std::string> check_experiment_against_model(const ExperimentSpec& spec, const ModelConfig& config,
                                                        const PolicyRegistry& registry) {
  std::vector<std::string> warnings;
  // Sizes the model cannot hold are errors now, not after an hour of other cells.
  const int64_t max_tokens = spec.engine.max_tokens > 0 ? spec.engine.max_tokens : config.max_seq_len;
  const std::string limit = spec.engine.max_tokens > 0
                                ? str_cat("engine.max_tokens (", max_tokens, ")")
                                : str_cat("the model's context (", max_tokens, " tokens; engine.max_tokens raises it)");
  for (const auto& e : spec.evals) e->check_limit(TokenLimit{max_tokens, limit});
  for (size_t i = 0; i < spec.engine.probe_layers.size(); ++i)
    if (spec.engine.probe_layers[i] >= config.n_layers)
      fail(spec.file.string(), ": engine.probe_layers[", i, "]: layer ", spec.engine.probe_layers[i],
           " does not exist (the model has ", config.n_layers, " layers)");

  // Every grid point is built for this model (a policy may reject a shape), and settings that
  // run but cannot differ from full attention are named.
  int64_t longest = 0;
  for (const auto& e : spec.evals) longest = std::max(longest, e->longest_tokens());
  for (const RunSpec& run : expand_runs(spec)) {
    // A combination of values the policy refuses (each value alone passed check_policies) is
    // reported at the entry's params line, naming the grid point.
    const SourceRef& ref = spec.policies[run.entry_index].params_ref;
    const std::string context = ref.line > 0 ? str_cat(ref.str(), " (run ", run.name, ")")
                                             : "policies." + run.name + ".params";
    const auto policy = registry.create(run.type, run.params, policy_shape(config), context);
    const auto effective = registry.effective_params(run.type, run.params, policy_shape(config), context);
    bool within = longest > 0;
    for (int l = 0; l < config.n_layers && within; ++l) {
      const int64_t b = policy->budget_tokens(l, longest);
      within = b >= longest;
    }
    if (within)
      warnings.push_back(str_cat(spec.policies[run.entry_index].ref.str(), ": run ", run.name,
                                 ": its budget keeps every token up to the longest input (", longest,
                                 " tokens), so it equals full attention"));
    for (const auto& e : spec.evals) {
      const std::string w = e->policy_warning(run.type, effective);
      if (!w.empty()) warnings.push_back(str_cat(spec.policies[run.entry_index].ref.str(), ": run ", run.name, ": ", w));
    }
  }
  return warnings;
}

std::string cell_identity(const ExperimentSpec& spec, const RunSpec& run,
                          const std::map<std::string, ParamValue>& effective_params, const CellSpec& cell,
                          const IdentityInputs& in) {
  std::string id;
  auto line = [&](const std::string& key, const auto&... value) { id += str_cat(key, ": ", value..., "\n"); };
  auto digest = [&](const fs::path& p) {
    auto it = in.file_sha256.find(p.string());
    return it == in.file_sha256.end() ? std::string("?") : it->second;
  };
  auto ints = [](const auto& v) {
    std::string out;
    for (const auto& x : v) out += (out.empty() ? "" : ",") + str_cat(x);
    return "[" + out + "]";
  };
  line("experiment", spec.name);
  line("model_sha256", in.model_sha256);
  line("model_dtype", spec.model.dtype);
  line("tokenizer_sha256", spec.model.tokenizer.empty() ? std::string("(the model's)") : digest(spec.model.tokenizer));
  line("device", in.device);
  line("kv.block_size", spec.kv.block_size_tokens);
  line("kv.budget_bytes", spec.kv.budget_bytes);
  if (spec.kv.per_head_tables) line("kv.block_tables", "per_head");  // per_layer: the identity of before
  if (run.kv_format != "f32")  // f32: the identity of before
    line("kv.format", run.kv_format, " fp8_scale ",
         spec.kv.fp8_scale_from_prompt ? std::string("prompt") : str_cat(spec.kv.fp8_scale),
         " group_size ", spec.kv.group_size, " residual ", spec.kv.residual);
  line("engine.prefill_chunk", spec.engine.prefill_chunk_tokens);
  line("engine.probe", spec.engine.probe ? 1 : 0);
  line("engine.probe_every", spec.engine.probe_every);
  line("engine.probe_layers", ints(spec.engine.probe_layers));
  line("engine.max_tokens", spec.engine.max_tokens);
  line("run", run.name);
  line("policy.type", run.type);
  for (const auto& [k, v] : effective_params) {
    // budget_layers (policies/budget.h) "all", its default: the identity of before the parameter
    // existed, so results written before it resume
    if (k == "budget_layers" && to_string(v) == "all") continue;
    line("policy." + k, to_string(v));
  }
  line("seeds", ints(spec.seeds));
  line("cell", cell.id);
  id += spec.evals[cell.eval]->identity(cell.eval_cell, digest);
  return id;
}

// engine.prefix_reuse: a forked child gets a fresh policy (a policy's state cannot be copied,
// engine.h), so a run reuses prefixes only when a fresh policy is what prefilled them: full
// attention, which keeps no state. Others (every budgeted policy acts or observes during the
// prefill, or would need a declaration that it does not) prefill every prompt.
static bool prefix_reuse_allowed(const std::string& type) { return type == "full"; }

// Reuse needs the CPU store's fork and no probes (each snapshot would copy the probe's dense
// shadow of the cache); otherwise a warning and no reuse.
static bool prefix_reuse_possible(const ExperimentSpec& spec, Device device, std::FILE* progress) {
  if (!spec.engine.prefix_reuse) return false;
  const char* why = device != Device::kCpu ? "the device backends do not fork sequences"
                    : spec.engine.probe     ? "engine.probe is on (each snapshot would copy the probe's shadow cache)"
                                            : nullptr;
  if (!why) return true;
  if (progress) std::fprintf(progress, "warning: engine.prefix_reuse is off: %s\n", why);
  return false;
}

int run_experiment(const ExperimentSpec& spec, const RunOptions& o) {
  std::ostream& out = o.out ? *o.out : std::cout;
  check_device(o.device);
  for (const std::string& format : spec.kv.formats)
    if (o.device != Device::kCpu && format != "f32")
      fail(spec.kv.format_ref.str(), ": kv.format ", format, " is not available with --device ",
           device_name(o.device), " (its kernels read f32 host pages; the device pool's precision is --device-dtype)");
  check_files_exist(spec);
  PolicyRegistry registry = make_builtin_registry();
  for (const auto& p : spec.plugins) registry.load_plugin(p);
  check_policies(spec, PolicyLookup{[&](const std::string& t) { return registry.find(t); },
                                    [&] { return registry.names(); }});
  const std::vector<RunSpec> runs = expand_runs(spec);
  const std::vector<CellSpec> cells = expand_cells(spec, runs);

  LoadOptions load;
  load.weight_dtype = spec.model.dtype;
  load.tokenizer_path = spec.model.tokenizer;
  load.require_tokenizer = !o.dry_run;
  load.load_tokenizer = !o.dry_run;
  const std::unique_ptr<Model> model = load_model(spec.model.path, load);
  const ModelConfig& config = model->config;
  for (const std::string& format : spec.kv.formats)  // each format's shape against the model, before any work
    if (kv_format_is_kivi(store_config(spec, config, format).format) && config.head_dim % spec.kv.group_size != 0)
      fail(spec.kv.format_ref.str(), ": kv.group_size ", spec.kv.group_size, " does not divide the model's head_dim ",
           config.head_dim, " (", format, " groups values over kv.group_size channels)");
  const std::vector<std::string> warnings = check_experiment_against_model(spec, config, registry);
  if (o.progress)
    for (const std::string& w : warnings) std::fprintf(o.progress, "warning: %s\n", w.c_str());
  if (o.dry_run) {
    dry_run(spec, runs, cells, o, *model, registry, out);
    return 0;
  }
  const Tokenizer& tokenizer = *model->tokenizer;

  // A pool that cannot hold one token (a block in every layer) is an error before any file.
  for (const std::string& format : spec.kv.formats) {
    if (spec.kv.budget_bytes == 0) break;
    const KvStoreConfig kc = store_config(spec, config, format);
    // The blocks one token takes: one per layer, or one per (layer, KV head) with per-head tables.
    const uint64_t block_bytes = uint64_t(kv_block_bytes(kc)) * (kc.per_head_tables ? config.n_kv_heads : 1);
    if (spec.kv.budget_bytes / block_bytes < uint64_t(config.n_layers))
      fail(spec.file.string(), ": kv.budget_bytes = ", spec.kv.budget_bytes, " bytes holds ",
           spec.kv.budget_bytes / block_bytes, " KV blocks of ", block_bytes, " bytes (kv.block_size ",
           spec.kv.block_size_tokens, " tokens), fewer than one per layer (", config.n_layers,
           "): one token needs ", block_bytes * config.n_layers, " bytes; 0 = room for the model's context");
  }

  // Inputs, tokenized once (errors name the key).
  for (const auto& e : spec.evals) e->prepare(tokenizer);

  // Cell identities: what each cell computes, independent of the YAML's wording.
  IdentityInputs ids;
  ids.model_sha256 = sha256_of_path(spec.model.path);
  ids.device = o.device == Device::kCuda
                   ? str_cat("cuda ", device_dtype_name(o.device_dtype), ": ", cuda_device_summary())
               : o.device == Device::kEmulated ? str_cat("emulated ", device_dtype_name(o.device_dtype))
                                        : std::string("cpu");
  if (!spec.model.tokenizer.empty()) ids.file_sha256[spec.model.tokenizer.string()] = sha256_of_path(spec.model.tokenizer);
  for (const auto& e : spec.evals)
    for (const auto& [key, path] : e->input_files()) ids.file_sha256[path.string()] = sha256_of_path(path);
  std::vector<std::map<std::string, ParamValue>> effective;
  for (const RunSpec& run : runs)
    effective.push_back(registry.effective_params(run.type, run.params, policy_shape(config), "policies." + run.name + ".params"));
  std::vector<std::string> identity;
  for (const CellSpec& c : cells) identity.push_back(cell_identity(spec, runs[c.run], effective[c.run], c, ids));

  // The results file.
  const fs::path output = o.output.empty() ? spec.output : o.output;
  std::optional<ResultsFile> file;
  if (o.resume && fs::exists(output)) {
    file = ResultsFile::open(output);
    const AttrMap root = file->root_attrs();
    auto version = root.find("schema_version");
    const bool has_identities = version != root.end() && std::get<int64_t>(version->second) >= 2;
    auto it = root.find("experiment");
    if (!has_identities && (it == root.end() || it->second != AttrValue(spec.yaml_text)))
      fail(output.string(), ": written by an older kvlab (results schema 1, no cell identities) for a "
           "different YAML text than ", spec.file.string(), "; resume it with the same file, or start a new "
           "output (-o NEW.h5) or --overwrite");
    auto sha = root.find("model_sha256");
    if (sha != root.end() && sha->second != AttrValue(ids.model_sha256))
      fail(output.string(), ": was run with another model file (sha256 ", attr_text(sha->second), ", ",
           spec.model.path.string(), " has ", ids.model_sha256, "); start a new output (-o NEW.h5) or --overwrite");
    const int deleted = file->delete_incomplete_cells();
    if (deleted && o.progress) std::fprintf(o.progress, "resume: removed %d interrupted cell(s)\n", deleted);
    if (has_identities) {
      // A complete cell stays only if it computed what the experiment asks for now.
      const std::vector<std::string> present = file->runs();
      for (const CellSpec& c : cells) {
        const std::string& run = runs[c.run].name;
        if (std::find(present.begin(), present.end(), run) == present.end() || !file->cell_complete(run, c.id)) continue;
        const AttrMap a = file->cell_attrs(run, c.id);
        auto old = a.find("identity");
        const std::string before = old == a.end() ? std::string() : attr_text(old->second);
        if (before == identity[c.index]) continue;
        fail(output.string(), ": cell ", run, "/", c.id, " was computed with other settings (",
             first_difference(before, identity[c.index]), "); resume continues only an experiment whose "
             "existing cells are unchanged: write a new output (-o NEW.h5) or use --overwrite");
      }
    }
    // The file now records this experiment (the grid may have grown).
    file->set_root_attr("experiment", spec.yaml_text);
    file->set_root_attr("experiment_file", spec.file.string());
    file->set_root_attr("name", spec.name);
    file->set_root_attr("cells_total", int64_t(cells.size()));
  } else {
    if (fs::exists(output) && !o.overwrite)
      fail(output.string(), ": already exists (--resume continues it, --overwrite replaces it)");
    std::vector<int64_t> seeds(spec.seeds.begin(), spec.seeds.end());
    AttrMap root{{"kvlab_version", std::string(kVersion)},
                 {"git_commit", std::string(kGitCommit)},
                 {"experiment", spec.yaml_text},
                 {"experiment_file", spec.file.string()},
                 {"name", spec.name},
                 {"start_time", utc_now_iso8601()},
                 {"host", host_name()},
                 {"model_path", spec.model.path.string()},
                 {"model_sha256", ids.model_sha256},
                 {"model_format", model->format},
                 {"model_config", model_config_json(config)},
                 {"model_dtype", spec.model.dtype},
                 {"tokenizer", str_cat(tokenizer.kind(), " (vocab ", tokenizer.vocab_size(), ", bos ",
                                       tokenizer.bos_id(), ", eos ", tokenizer.eos_id(), ")")},
                 {"seeds", seeds},
                 {"cells_total", int64_t(cells.size())},
                 {"shard", str_cat(o.shard.index, "/", o.shard.count)},
                 {"kv_bytes_per_token", int64_t(kv_bytes_per_token(store_config(spec, config, spec.kv.formats.front())))},
                 {"device", ids.device}};
    file = ResultsFile::create(output, root);
  }
  for (size_t r = 0; r < runs.size(); ++r) {
    const RunSpec& run = runs[r];
    AttrMap a{{"policy_name", run.entry_name}, {"policy_type", run.type}, {"kv_format", run.kv_format},
              {"kv_bytes_per_token", int64_t(kv_bytes_per_token(store_config(spec, config, run.kv_format)))}};
    std::string params, eff;
    for (const auto& [k, v] : run.params) {
      a["param." + k] = param_attr(v);
      params += (params.empty() ? "" : ", ") + k + "=" + to_string(v);
    }
    for (const auto& [k, v] : effective[r]) {
      a["effective." + k] = param_attr(v);
      eff += (eff.empty() ? "" : ", ") + k + "=" + to_string(v);
    }
    a["params"] = params;
    a["effective_params"] = eff;
    file->ensure_run(run.name, a);
  }

  // The cells of this shard that are not complete yet.
  std::vector<const CellSpec*> todo;
  for (const CellSpec& c : cells)
    if (in_shard(c, o.shard) && !file->cell_complete(runs[c.run].name, c.id)) todo.push_back(&c);

  EngineOptions eo;
  eo.threads = o.threads >= 0 ? o.threads : spec.model.threads;
  eo.block_size_tokens = spec.kv.block_size_tokens;
  eo.kv_budget_bytes = spec.kv.budget_bytes;
  eo.kv_per_head_tables = spec.kv.per_head_tables;
  eo.prefill_chunk_tokens = spec.engine.prefill_chunk_tokens;
  eo.probe = spec.engine.probe;
  eo.probe_every = spec.engine.probe_every;
  eo.probe_layers = spec.engine.probe_layers;
  eo.max_tokens = spec.engine.max_tokens;
  eo.device = o.device;
  eo.device_dtype = o.device_dtype;
  eo.kv_fp8_scale = float(spec.kv.fp8_scale);
  eo.kv_fp8_scale_from_prompt = spec.kv.fp8_scale_from_prompt;
  eo.kv_group_size = spec.kv.group_size;
  eo.kv_residual = spec.kv.residual;
  // Prefix reuse keeps snapshots beside the live sequence: the default pool gets room for two
  // more sequences (engine_lm.h PrefixCache drops snapshots when the pool runs short).
  const bool reuse = prefix_reuse_possible(spec, o.device, o.progress);
  if (reuse && spec.kv.budget_bytes == 0) eo.max_batch = 3;
  // One engine (one KV store) per kv.format, built when its first cell comes: runs are ordered
  // format by format (cells.h), so one engine is alive at a time.
  std::unique_ptr<Engine> engine;
  std::string engine_format;
  std::unique_ptr<PrefixCache> cache;  // on `engine`; emptied when the run changes
  std::string cache_run;
  int64_t tokens_saved = 0, tokens_fed = 0;

  const bool interactive = o.progress_interactive >= 0 ? o.progress_interactive == 1
                                                       : (o.progress && Progress::is_terminal(o.progress));
  std::optional<Progress> progress;
  if (o.progress) progress.emplace(int(todo.size()), o.progress, interactive);
  int n_run = 0;
  for (const CellSpec* cell : todo) {
    const RunSpec& run = runs[cell->run];
    if (!engine || engine_format != run.kv_format) {
      cache.reset();
      engine.reset();
      eo.kv_format = store_config(spec, config, run.kv_format).format;
      engine = std::make_unique<Engine>(*model, eo);
      engine_format = run.kv_format;
    }
    EngineLm lm(*engine, [&registry, &run, shape = policy_shape(config)] {
      return registry.create(run.type, run.params, shape, "policies." + run.name + ".params");
    });
    if (reuse && prefix_reuse_allowed(run.type)) {
      if (!cache) cache = std::make_unique<PrefixCache>(*engine);
      if (cache_run != run.name) cache->clear();  // snapshots are of one run's policy
      cache_run = run.name;
      lm.prefix_cache = cache.get();
    }
    if (progress) {
      progress->cell_started(run.name + " " + cell->id);
      lm.on_tokens = [&](int64_t n) { progress->tokens(n); };
    }
    CellRecord rec;
    try {
      EvalContext ctx{lm, tokenizer, config, spec.seeds};
      rec = spec.evals[cell->eval]->run_cell(cell->eval_cell, ctx);
    } catch (const KvPoolExhausted& e) {
      if (progress) progress->finish();
      fail(spec.file.string(), ": kv.budget_bytes = ",
           spec.kv.budget_bytes ? str_cat(spec.kv.budget_bytes, " bytes") : std::string("0 (the default pool)"),
           " is too small for run '",
           run.name, "', cell ", cell->id, ": ", e.what(), ". Raise kv.budget_bytes (0 = room for the model's "
           "context); the ", n_run, " cell(s) finished in this run are in ", output.string());
    }
    if (lm.prefix_cache) {
      rec.attrs["prefill_tokens_saved"] = lm.prefill_tokens_saved;
      tokens_saved += lm.prefill_tokens_saved;
    }
    tokens_fed += lm.prefill_tokens;
    rec.attrs["run"] = run.name;
    rec.attrs["policy_type"] = run.type;
    rec.attrs["effective_params"] = std::get<std::string>(file->run_attrs(run.name).at("effective_params"));
    rec.attrs["identity"] = identity[cell->index];
    rec.attrs["cell_index"] = int64_t(cell->index);
    rec.attrs["finished_at"] = utc_now_iso8601();
    file->write_cell(run.name, cell->id, rec);
    ++n_run;
    if (progress) {
      progress->cell_finished(spec.evals[cell->eval]->outcome(rec));
    }
  }
  if (progress) progress->finish();
  cache.reset();
  if (reuse && o.progress)
    std::fprintf(o.progress, "prefix reuse: %lld of %lld prompt tokens forked instead of prefilled (%.1f%%)\n",
                 static_cast<long long>(tokens_saved), static_cast<long long>(tokens_fed),
                 tokens_fed ? 100.0 * double(tokens_saved) / double(tokens_fed) : 0.0);
  write_summaries(*file, spec);
  file->set_root_attr("end_time", utc_now_iso8601());
  print_report(*file, out);
  return n_run;
}

}  // namespace kvlab
