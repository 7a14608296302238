// A built-in English vocabulary for the RULER tasks (ruler_tasks.h): keys are "adjective-noun"
// (RULER's niah.py draws its keys the same way from the wonderwords package's lists, which are
// not available offline), and cwe's words come from all three lists. kvlab's own lists.
#pragma once

#include <string>
#include <vector>

namespace kvlab {

extern const std::vector<std::string> kRulerAdjectives;
extern const std::vector<std::string> kRulerNouns;
extern const std::vector<std::string> kRulerVerbs;

}  // namespace kvlab
