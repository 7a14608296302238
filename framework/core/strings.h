// Small string helpers shared by every place that reads user-written names (YAML keys, policy
// names, parameters): the "did you mean ...?" suggestion.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace kvlab {

// Levenshtein distance (insertions, deletions, substitutions each cost 1).
inline size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The candidate closest to `key` when it is close enough to be a likely misspelling (edit
// distance <= max(3, |key| / 3); the first one on a tie); "" otherwise.
inline std::string nearest_name(std::string_view key, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(3, key.size() / 3) + 1;
  for (const auto& c : candidates)
    if (size_t d = edit_distance(key, c); d < best_d) best_d = d, best = c;
  return best;
}

}  // namespace kvlab
