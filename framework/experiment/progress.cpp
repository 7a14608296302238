#include "framework/experiment/progress.h"

#include <unistd.h>

#include <cmath>

#include "framework/core/error.h"

namespace kvlab {

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = std::lround(s);
  if (t >= 3600) return str_cat(t / 3600, "h", (t % 3600) / 60 < 10 ? "0" : "", (t % 3600) / 60, "m");
  if (t >= 60) return str_cat(t / 60, "m", t % 60 < 10 ? "0" : "", t % 60, "s");
  return str_cat(t, "s");
}

Progress::Progress(int total_cells, std::FILE* out, bool interactive)
    : total_(total_cells), out_(out), interactive_(interactive), start_(Clock::now()),
      cell_start_(start_), last_draw_(start_) {}

bool Progress::is_terminal(std::FILE* out) { return isatty(fileno(out)) == 1; }

void Progress::cell_started(const std::string& label) {
  label_ = label;
  cell_tokens_ = 0;
  cell_start_ = Clock::now();
  draw(true);
}

void Progress::tokens(int64_t tokens_in_cell) {
  total_tokens_ += tokens_in_cell - cell_tokens_;
  cell_tokens_ = tokens_in_cell;
  draw(false);
}

std::string Progress::eta_text() const {
  if (done_ == 0) return "?";
  const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
  return format_duration(elapsed / done_ * (total_ - done_));
}

void Progress::draw(bool force) {
  if (!interactive_) return;
  const auto now = Clock::now();
  if (!force && now - last_draw_ < std::chrono::milliseconds(200)) return;
  last_draw_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? double(total_tokens_) / elapsed : 0;
  std::fprintf(out_, "\r\033[K[%d/%d] %s  %.0f tok/s  ETA %s", done_, total_, label_.c_str(), rate,
               eta_text().c_str());
  std::fflush(out_);
}

void Progress::cell_finished(const std::string& outcome) {
  ++done_;
  const auto now = Clock::now();
  const double cell_s = std::chrono::duration<double>(now - cell_start_).count();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? double(total_tokens_) / elapsed : 0;
  if (interactive_) {
    draw(true);
  } else {
    std::fprintf(out_, "[%d/%d] %s: %s (%.1fs, %.0f tok/s overall, ETA %s)\n", done_, total_,
                 label_.c_str(), outcome.c_str(), cell_s, rate, eta_text().c_str());
    std::fflush(out_);
  }
}

void Progress::finish() {
  if (interactive_) std::fprintf(out_, "\n");
  std::fflush(out_);
}

}  // namespace kvlab
