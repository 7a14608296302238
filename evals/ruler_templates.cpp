// RULER's prompt templates (ruler_tasks.h): the built-in sets and the check of a user's set.
#include <optional>
#include <string>

#include "evals/ruler_tasks.h"

namespace kvlab {

const char* ruler_family_name(RulerFamily f) {
  switch (f) {
    case RulerFamily::kNiah: return "niah";
    case RulerFamily::kVt: return "vt";
    case RulerFamily::kCwe: return "cwe";
    case RulerFamily::kFwe: return "fwe";
    case RulerFamily::kPasskey: return "passkey";
    case RulerFamily::kKvRetrieval: return "kv_retrieval";
  }
  return "?";
}

RulerTemplate& RulerTemplates::of(RulerFamily f) {
  switch (f) {
    case RulerFamily::kNiah: return niah;
    case RulerFamily::kVt: return vt;
    case RulerFamily::kCwe: return cwe;
    case RulerFamily::kFwe: return fwe;
    case RulerFamily::kPasskey: return passkey;
    case RulerFamily::kKvRetrieval: return kv_retrieval;
  }
  return niah;
}
const RulerTemplate& RulerTemplates::of(RulerFamily f) const { return const_cast<RulerTemplates*>(this)->of(f); }

std::optional<RulerTemplates> builtin_ruler_templates(const std::string& name) {
  RulerTemplates t;
  t.name = name;
  if (name == "instruct") {
    // RULER's prompt structure (an instruction, the haystack, a question, an answer prefix:
    // NVIDIA/RULER scripts/data/synthetic/constants.py) in kvlab's own words, for
    // instruction-tuned models. RULER's own strings are not shipped (the project copies no
    // text); give them as a `templates:` mapping to compare with published RULER numbers.
    t.niah = {"The text below hides special {types}. Remember them: questions about them follow.\n",
              "The special {type_one} for {key} is: {value}.",
              "\nList every special {type} for {query} given in the text above.",
              " Special {type} for {query}:"};
    t.vt = {"The text below hides chains of variable assignments. Follow each chain.\n\n", "",
            "\nQuestion: which variables end up holding the value {query}?",
            " Answer: the {num_v} variables holding the value {query} are: "};
    t.cwe = {"Below is a numbered list of words; some appear more often than the others. Keep count.\n", "",
             "\nQuestion: which 10 words appear most often in the list above?",
             " Answer: the 10 most frequent words are:"};
    t.vt.example = t.cwe.example = true;  // RULER prepends a solved example to both (ruler_tasks.h)
    t.fwe = {"Count how often each coded word occurs in the coded text below. ", "",
             "\nQuestion: ignoring the dots '....', which three coded words occur most often? Give no explanation.",
             " Answer: the three most frequent coded words are:"};
    t.passkey = {"A pass key is hidden somewhere in the irrelevant text below. Find it and remember it.",
                 "The pass key is {value}. Remember it. {value} is the pass key.", "What is the pass key?",
                 " The pass key is"};
    t.kv_retrieval = {"Find the value of the requested key in the JSON object below.\n\nJSON data:\n{",
                      "\"{key}\": \"{value}\",", "}\n\nKey: \"{query}\"\n", "Value of that key:"};
    return t;
  }
  if (name == "kvlab-tiny") {
    // The bundled model continues a sentence it has read: every answer prefix ends with the
    // words that precede the value in the needle (POLICIES.md 18).
    t.niah = {"", "The special magic {type_one} for {key} is {value}.",
              "What is the special magic {type_one} for {query}?", " The special magic {type_one} for {query} is"};
    t.vt = {"", "", "Which variables hold the value {query}?", " The variables that hold the value {query} are VAR"};
    t.cwe = {"", "", "Which words appear most often in the list?", " The words that appear most often are"};
    t.fwe = {"", "", "Which words appear most often in the text?", " The words that appear most often are"};
    t.passkey = {"", "The pass key is {value}. Remember it. {value} is the pass key.", "What is the pass key?",
                 " The pass key is"};
    t.kv_retrieval = {"", "The value of key {key} is {value}.", "What is the value of key {query}?",
                      " The value of key {query} is"};
    return t;
  }
  return std::nullopt;
}

std::string check_ruler_template(RulerFamily family, const RulerTemplate& t) {
  const std::string where = std::string("templates.") + ruler_family_name(family);
  auto has = [](const std::string& s, const char* p) { return s.find(p) != std::string::npos; };
  const bool keyed = family == RulerFamily::kNiah || family == RulerFamily::kKvRetrieval;
  if (keyed && !has(t.needle, "{key}")) return where + ".needle: missing {key}";
  if ((keyed || family == RulerFamily::kPasskey) && !has(t.needle, "{value}")) return where + ".needle: missing {value}";
  if ((keyed || family == RulerFamily::kVt) && !has(t.question + t.answer_prefix, "{query}"))
    return where + ".question: missing {query} (in the question or the answer_prefix)";
  return "";
}

}  // namespace kvlab
