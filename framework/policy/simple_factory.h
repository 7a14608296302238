// SimplePolicyFactory: a PolicyFactory from a name, a one-line doc, parameter specs and a
// create function, so a policy file needs no factory boilerplate:
//
//   registry.add(std::make_unique<SimplePolicyFactory>("full", "exact attention", ParamSpecs{},
//       [](const ParamValues&, const PolicyModelShape&) { return std::make_unique<Full>(); }));
//
// The conformance suite's parameter sets (PolicyFactory::conformance_configs) go after the
// unlimited parameters:
//
//   std::make_unique<SimplePolicyFactory>("knorm", doc, specs, create, unlimited,
//       SimplePolicyFactory::Conformance{{.params = {{"keep", 0.2}}, .evicts = true}});
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "framework/policy/policy.h"

namespace kvlab {

class SimplePolicyFactory : public PolicyFactory {
 public:
  using CreateFn = std::function<std::unique_ptr<AttentionPolicy>(const ParamValues&,
                                                                  const PolicyModelShape&)>;
  // Resolves "auto" parameter values for a model shape (PolicyFactory::effective_params);
  // empty: the validated values are the effective ones.
  using ResolveFn = std::function<std::map<std::string, ParamValue>(const ParamValues&,
                                                                    const PolicyModelShape&)>;
  using Conformance = std::vector<ConformanceConfig>;
  SimplePolicyFactory(std::string name, std::string doc, ParamSpecs specs, CreateFn create,
                      std::optional<std::map<std::string, ParamValue>> unlimited = std::nullopt,
                      ResolveFn resolve = nullptr)
      : SimplePolicyFactory(std::move(name), std::move(doc), std::move(specs), std::move(create),
                            std::move(unlimited), Conformance{}, std::move(resolve)) {}
  SimplePolicyFactory(std::string name, std::string doc, ParamSpecs specs, CreateFn create,
                      std::optional<std::map<std::string, ParamValue>> unlimited,
                      Conformance conformance, ResolveFn resolve = nullptr)
      : name_(std::move(name)), doc_(std::move(doc)), specs_(std::move(specs)),
        create_(std::move(create)), unlimited_(std::move(unlimited)),
        conformance_(std::move(conformance)), resolve_(std::move(resolve)) {}
  std::string name() const override { return name_; }
  std::string doc() const override { return doc_; }
  const ParamSpecs& params() const override { return specs_; }
  std::unique_ptr<AttentionPolicy> create(const ParamValues& params,
                                          const PolicyModelShape& shape) const override {
    return create_(params, shape);
  }
  std::optional<std::map<std::string, ParamValue>> unlimited_params() const override {
    return unlimited_;
  }
  std::map<std::string, ParamValue> effective_params(const ParamValues& params,
                                                     const PolicyModelShape& shape) const override {
    return resolve_ ? resolve_(params, shape) : params.all();
  }
  std::vector<ConformanceConfig> conformance_configs() const override { return conformance_; }

 private:
  std::string name_, doc_;
  ParamSpecs specs_;
  CreateFn create_;
  std::optional<std::map<std::string, ParamValue>> unlimited_;
  Conformance conformance_;
  ResolveFn resolve_;
};

}  // namespace kvlab
