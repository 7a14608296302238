// kvlab merge OUT.h5 SHARD.h5...: joins the results files of `kvlab run --shard I/N`.
#include <iostream>

#include "framework/cli/options.h"
#include "framework/core/error.h"
#include "framework/experiment/merge.h"

namespace kvlab::cli {

int run_merge(const std::vector<std::string>& args) {
  po::options_description desc("options");
  std::vector<std::string> files;
  desc.add_options()("files", po::value(&files)->multitoken()->required(), "OUT.h5 then the shard files")
      ("overwrite", "replace OUT.h5 when it exists");
  po::variables_map vm;
  if (!parse_options(args, "kvlab merge OUT.h5 SHARD.h5...", desc, {{"files", -1}}, vm)) return 0;
  if (files.size() < 2) fail("expected OUT.h5 and at least one shard file (see kvlab merge --help)");
  const std::filesystem::path out = files[0];
  if (std::filesystem::exists(out) && !vm.count("overwrite"))
    fail(out.string(), ": already exists (use --overwrite to replace it)");
  std::vector<std::filesystem::path> shards(files.begin() + 1, files.end());
  const int n = merge_results(out, shards);
  std::cout << "merged " << n << " cells from " << shards.size() << " files into " << out.string() << "\n";
  return 0;
}

}  // namespace kvlab::cli
