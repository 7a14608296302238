// kvlab run EXP.yaml: expands the experiment into cells, runs them, writes HDF5 (runner.h).
#include <iostream>

#include "framework/cli/options.h"
#include "framework/core/error.h"
#include "framework/experiment/experiment.h"
#include "framework/experiment/runner.h"

namespace kvlab::cli {

int run_run(const std::vector<std::string>& args) {
  po::options_description desc("options");
  std::string experiment, output, device = "cpu", device_dtype = "bf16", shard = "0/1";
  int threads = -1;
  desc.add_options()
      ("experiment", po::value(&experiment)->required(), "the experiment YAML file")
      ("output,o", po::value(&output), "results file (default: the YAML's output:)")
      ("resume", "continue an existing results file: run only the cells it lacks (cells are matched by identity: "
                 "a comment or an added policy, length or depth resumes; a changed setting is an error)")
      ("overwrite", "replace an existing results file")
      ("threads", po::value(&threads), "CPU threads (default: model.threads of the YAML; 0 = all cores)")
      ("device", po::value(&device), "cpu | cuda (the GPU: dense layers and attention; policies stay on the CPU) | "
                                     "emulated (the GPU path's plans on CPU loops: slow, for checking)")
      ("device-dtype", po::value(&device_dtype), "cuda: bf16 (weights, KV pages, GEMM inputs; default) | f32 (agrees with cpu to float tolerance)")
      ("dry-run", "list the cells and their estimated KV memory; run nothing")
      ("shard", po::value(&shard), "I/N: run only cells with index % N == I (Slurm arrays; join with kvlab merge)");
  po::variables_map vm;
  if (!parse_options(args, "kvlab run EXP.yaml [-o OUT.h5] [--resume | --overwrite] [--threads N] [--device cpu|cuda [--device-dtype bf16|f32]] "
                           "[--dry-run] [--shard I/N]",
                     desc, {{"experiment", 1}}, vm))
    return 0;
  RunOptions o;
  o.output = output;
  o.resume = vm.count("resume") > 0;
  o.overwrite = vm.count("overwrite") > 0;
  if (o.resume && o.overwrite) fail("--resume and --overwrite exclude each other");
  o.threads = threads;
  if (vm.count("threads") && threads < 0) fail("--threads: expected 0 (all cores) or more, got ", threads);
  o.device = parse_device(device, "--device");
  o.device_dtype = parse_device_dtype(device_dtype, "--device-dtype");
  o.dry_run = vm.count("dry-run") > 0;
  o.shard = parse_shard(shard);
  const ExperimentSpec spec = parse_experiment(experiment);
  run_experiment(spec, o);
  return 0;
}

}  // namespace kvlab::cli
