// RULER's scoring of an answer (ruler_tasks.h).
#include <cctype>
#include <string>
#include <vector>

#include "evals/niah.h"
#include "evals/ruler_tasks.h"

namespace kvlab {

namespace {
std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
}  // namespace

// RULER scripts/eval/synthetic/constants.py string_match_all / string_match_part.
double string_match_all(const std::string& prediction, const std::vector<std::string>& references) {
  if (references.empty()) return 0;
  const std::string p = lower(prediction);
  int hits = 0;
  for (const auto& r : references) hits += p.find(lower(r)) != std::string::npos;
  return double(hits) / double(references.size());
}

double string_match_part(const std::string& prediction, const std::vector<std::string>& references) {
  const std::string p = lower(prediction);
  for (const auto& r : references)
    if (p.find(lower(r)) != std::string::npos) return 1.0;
  return 0.0;
}

double ruler_score(RulerScoring scoring, const std::string& prediction, const std::vector<std::string>& references) {
  switch (scoring) {
    case RulerScoring::kMatchAll: return string_match_all(prediction, references);
    case RulerScoring::kMatchPart: return string_match_part(prediction, references);
    case RulerScoring::kFirstNumber:
      return !references.empty() && value_matches(prediction, references.front()) ? 1.0 : 0.0;
  }
  return 0;
}

}  // namespace kvlab
