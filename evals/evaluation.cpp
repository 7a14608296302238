// The evaluation registry (evaluation.h).
#include "evals/evaluation.h"

#include "evals/niah_eval.h"
#include "evals/perplexity_eval.h"
#include "evals/ruler_eval.h"
#include "framework/core/error.h"

namespace kvlab {

void EvaluationRegistry::add(std::unique_ptr<EvaluationFactory> factory) {
  if (find(factory->name())) fail("evaluation '", factory->name(), "' registered twice");
  factories_.push_back(std::move(factory));
}

const EvaluationFactory* EvaluationRegistry::find(const std::string& name) const {
  for (const auto& f : factories_)
    if (f->name() == name) return f.get();
  return nullptr;
}

std::vector<std::string> EvaluationRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& f : factories_) out.push_back(f->name());
  return out;
}

const EvaluationRegistry& builtin_evaluations() {
  static const EvaluationRegistry registry = [] {
    EvaluationRegistry r;
    r.add(make_niah_factory());
    r.add(make_perplexity_factory());
    r.add(make_ruler_factory());
    return r;
  }();
  return registry;
}

}  // namespace kvlab
