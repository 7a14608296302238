// kvlab_bench_tokenizer: single-thread encoding throughput (MB/s of input text) of the
// SentencePiece and byte-level BPE tokenizers on English prose.
//
//   kvlab_bench_tokenizer [--shared DIR] [--repeats N]
//
// Text: every paragraph of DIR/text/pride_and_prejudice.txt (split at blank lines, as the tests
// do), each encoded by its own encode() call. Reports, per tokenizer, the first pass on a freshly
// loaded tokenizer (cold: BPE's word memo empty) and the best of N further passes (warm).
// tests/tokenizer/bench_sentencepiece.py measures python3-sentencepiece on the same paragraphs.
// Time is the process CPU time (CLOCK_PROCESS_CPUTIME_ID), so that other processes sharing the
// cores do not count; wall-clock figures are printed too.
#include <algorithm>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "framework/tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;

std::vector<std::string> paragraphs(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) kvlab::fail(path.string(), ": cannot open (needs ../shared)");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> out;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find("\n\n", begin);
    if (end == std::string::npos) end = text.size();
    std::string p = text.substr(begin, end - begin);
    if (p.find_first_not_of(" \t\r\n") != std::string::npos) out.push_back(std::move(p));
    begin = end + 2;
  }
  return out;
}

double seconds(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

struct Timing {
  double cpu_s, wall_s;
};

// Time to encode every paragraph once; `n_tokens` gets the total id count.
Timing encode_all(const kvlab::Tokenizer& tok, const std::vector<std::string>& texts, size_t* n_tokens) {
  const double cpu0 = seconds(CLOCK_PROCESS_CPUTIME_ID), wall0 = seconds(CLOCK_MONOTONIC);
  size_t n = 0;
  for (const std::string& t : texts) n += tok.encode(t).size();
  *n_tokens = n;
  return {seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu0, seconds(CLOCK_MONOTONIC) - wall0};
}

void bench(const char* label, const fs::path& tokenizer_path, const std::vector<std::string>& texts,
           size_t n_bytes, int repeats) {
  const auto tok = kvlab::load_tokenizer(tokenizer_path);
  size_t n_tokens = 0;
  const Timing cold = encode_all(*tok, texts, &n_tokens);
  Timing best{1e30, 1e30};
  for (int r = 0; r < repeats; ++r) {
    const Timing t = encode_all(*tok, texts, &n_tokens);
    best = {std::min(best.cpu_s, t.cpu_s), std::min(best.wall_s, t.wall_s)};
  }
  const double mb = n_bytes / 1e6;
  std::printf("%-14s %-16s %7zu tokens  cold %6.2f MB/s (wall %6.2f)  warm %6.2f MB/s (wall %6.2f)\n", label,
              tokenizer_path.filename().string().c_str(), n_tokens, mb / cold.cpu_s, mb / cold.wall_s,
              mb / best.cpu_s, mb / best.wall_s);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    fs::path shared = std::getenv("KVLAB_SHARED_DIR") ? fs::path(std::getenv("KVLAB_SHARED_DIR"))
                                                     : fs::path(KVLAB_SOURCE_DIR) / ".." / "shared";
    int repeats = 5;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--shared" && i + 1 < argc) shared = argv[++i];
      else if (a == "--repeats" && i + 1 < argc) repeats = std::max(1, std::atoi(argv[++i]));
      else kvlab::fail("usage: kvlab_bench_tokenizer [--shared DIR] [--repeats N] (got '", a, "')");
    }
    const std::vector<std::string> texts = paragraphs(shared / "text/pride_and_prejudice.txt");
    size_t n_bytes = 0;
    for (const std::string& t : texts) n_bytes += t.size();
    std::printf("Pride and Prejudice: %zu paragraphs, %.3f MB, single thread, CPU time, best of %d warm passes\n",
                texts.size(), n_bytes / 1e6, repeats);
    bench("sentencepiece", shared / "tokenizers/llama2/tokenizer.model", texts, n_bytes, repeats);
    bench("bpe (gpt2)", shared / "tokenizers/gpt2/tokenizer.json", texts, n_bytes, repeats);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvlab_bench_tokenizer: error: %s\n", e.what());
    return 1;
  }
}
