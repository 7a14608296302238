// Progress display for `kvlab run`: cells done / total, tokens/s, ETA.
// On a terminal one status line is redrawn in place (at most 5 times a second); otherwise
// (a log file, a Slurm job) one plain line is printed when each cell finishes.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace kvlab {

class Progress {
 public:
  // `out` is usually stderr; `interactive` = isatty(out) unless forced.
  Progress(int total_cells, std::FILE* out, bool interactive);
  static bool is_terminal(std::FILE* out);

  void cell_started(const std::string& label);
  // Tokens fed through the model so far in the current cell (monotone within a cell).
  void tokens(int64_t tokens_in_cell);
  void cell_finished(const std::string& outcome);
  void finish();

 private:
  using Clock = std::chrono::steady_clock;
  void draw(bool force);
  std::string eta_text() const;

  int total_, done_ = 0;
  std::FILE* out_;
  bool interactive_;
  std::string label_;
  int64_t cell_tokens_ = 0, total_tokens_ = 0;
  Clock::time_point start_, cell_start_, last_draw_;
};

// "1h02m", "3m05s", "42s".
std::string format_duration(double seconds);

}  // namespace kvlab
