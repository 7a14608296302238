#include "policies/duo_heads.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>

#include "framework/core/error.h"

namespace kvlab {
namespace {

constexpr const char* kMagic = "# kvlab duo heads v1";
constexpr const char* kHeader = "layer\tkv_head\tscore";

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t tab = line.find('\t', start);
    out.push_back(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
    if (tab == std::string::npos) return out;
    start = tab + 1;
  }
}

// A decimal integer in [0, limit) (no sign, no spaces, no hex), else nullopt-like -1.
int64_t parse_index(const std::string& s, int64_t limit) {
  if (s.empty() || s.size() > 9) return -1;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v < limit ? v : -1;
}

}  // namespace

HeadScores read_head_file(const std::string& path, int n_layers, int n_kv_heads) {
  if (path.empty()) fail("duo head file: empty path");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open the head file");
  HeadScores h;
  h.n_layers = n_layers;
  h.n_kv_heads = n_kv_heads;
  const size_t n_pairs = size_t(n_layers) * n_kv_heads;
  h.score.assign(n_pairs, 0.0);
  std::vector<int> row_of(n_pairs, 0);  // line number of each pair's row; 0 = not seen
  std::string line;
  int line_no = 0;
  bool header = false;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line_no == 1) {
      if (line != kMagic)
        fail(path, ":1: not a kvlab head file (expected the first line '", kMagic, "')");
      continue;
    }
    if (!header && !line.empty() && line[0] == '#') continue;
    if (!header) {
      if (line != kHeader)
        fail(path, ":", line_no, ": expected the header 'layer<TAB>kv_head<TAB>score'");
      header = true;
      continue;
    }
    const std::vector<std::string> f = split_tabs(line);
    if (f.size() != 3)
      fail(path, ":", line_no, ": expected 3 TAB-separated fields (layer, kv_head, score), got ", f.size());
    const int64_t layer = parse_index(f[0], n_layers);
    if (layer < 0)
      fail(path, ":", line_no, ": layer '", f[0], "' is not an integer in [0, ", n_layers,
           ") (the model has ", n_layers, " layers)");
    const int64_t kv = parse_index(f[1], n_kv_heads);
    if (kv < 0)
      fail(path, ":", line_no, ": kv_head '", f[1], "' is not an integer in [0, ", n_kv_heads,
           ") (the model has ", n_kv_heads, " KV heads)");
    errno = 0;
    char* end = nullptr;
    const double score = f[2].empty() ? NAN : std::strtod(f[2].c_str(), &end);
    if (f[2].empty() || end != f[2].c_str() + f[2].size() || errno == ERANGE || !std::isfinite(score) ||
        score < 0 || score > 1)
      fail(path, ":", line_no, ": score '", f[2], "' is not a finite number in [0, 1]");
    const size_t idx = size_t(layer) * n_kv_heads + size_t(kv);
    if (row_of[idx] != 0)
      fail(path, ":", line_no, ": duplicate row for layer ", layer, " kv_head ", kv, " (first on line ",
           row_of[idx], ")");
    row_of[idx] = line_no;
    h.score[idx] = score;
  }
  if (line_no == 0) fail(path, ": empty head file");
  if (!header) fail(path, ": no header line 'layer<TAB>kv_head<TAB>score'");
  for (size_t idx = 0; idx < n_pairs; ++idx)
    if (row_of[idx] == 0)
      fail(path, ": no row for layer ", idx / n_kv_heads, " kv_head ", idx % n_kv_heads, " (the model has ",
           n_layers, " layers x ", n_kv_heads, " KV heads; the file may be for another model)");
  return h;
}

void write_head_file(const std::string& path, const HeadScores& scores,
                     const std::vector<std::string>& comment) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) fail(path, ": cannot write the head file");
  std::fprintf(f, "%s\n", kMagic);
  for (const std::string& c : comment) std::fprintf(f, "# %s\n", c.c_str());
  std::fprintf(f, "%s\n", kHeader);
  for (int l = 0; l < scores.n_layers; ++l)
    for (int h = 0; h < scores.n_kv_heads; ++h) std::fprintf(f, "%d\t%d\t%.9g\n", l, h, scores.at(l, h));
  if (std::fclose(f) != 0) fail(path, ": write failed");
}

std::vector<uint8_t> top_fraction_heads(const HeadScores& scores, double fraction) {
  const size_t n = scores.score.size();
  // ceil(fraction * n), less 1e-9 so that a product meant to be an integer but rounded up in
  // double (0.1 * 30 = 3.0000000000000004) is not rounded up to the next head.
  const size_t keep = std::min(n, size_t(std::max(0.0, std::ceil(fraction * double(n) - 1e-9))));
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return scores.score[a] > scores.score[b]; });
  std::vector<uint8_t> mask(n, 0);
  for (size_t i = 0; i < keep; ++i) mask[order[i]] = 1;
  return mask;
}

}  // namespace kvlab
