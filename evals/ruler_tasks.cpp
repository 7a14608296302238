// RULER's synthetic tasks (ruler_tasks.h). Definitions after NVIDIA/RULER
// scripts/data/synthetic/*.py, scripts/synthetic.yaml and constants.py (cited per function).
#include "evals/ruler_tasks.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <limits>
#include <numbers>

#include "evals/ruler_words.h"
#include "framework/core/error.h"

namespace kvlab {
namespace {

// RULER synthetic.yaml: haystack, key/value types and needle counts per task; token budgets
// from constants.py (niah 128, variable_tracking 30, common_words_extraction 120,
// freq_words_extraction 50). passkey: the value is at most 5 digits, 16 tokens are ample;
// kv_retrieval: InfiniteBench generates 50 tokens for it.
const std::vector<RulerTaskInfo> kTasks = {
    {RulerTask::kNiahSingle1, "niah_single_1", RulerFamily::kNiah, RulerHaystack::kNoise},
    {RulerTask::kNiahSingle2, "niah_single_2", RulerFamily::kNiah, RulerHaystack::kEssay},
    {RulerTask::kNiahSingle3, "niah_single_3", RulerFamily::kNiah, RulerHaystack::kEssay, RulerItem::kWord, RulerItem::kUuid},
    {RulerTask::kNiahMultikey1, "niah_multikey_1", RulerFamily::kNiah, RulerHaystack::kEssay, RulerItem::kWord, RulerItem::kNumber, 4},
    {RulerTask::kNiahMultikey2, "niah_multikey_2", RulerFamily::kNiah, RulerHaystack::kNeedle},
    {RulerTask::kNiahMultikey3, "niah_multikey_3", RulerFamily::kNiah, RulerHaystack::kNeedle, RulerItem::kUuid, RulerItem::kUuid},
    {RulerTask::kNiahMultivalue, "niah_multivalue", RulerFamily::kNiah, RulerHaystack::kEssay, RulerItem::kWord, RulerItem::kNumber, 1, 4},
    {RulerTask::kNiahMultiquery, "niah_multiquery", RulerFamily::kNiah, RulerHaystack::kEssay, RulerItem::kWord, RulerItem::kNumber, 4, 1, 4},
    {RulerTask::kVt, "vt", RulerFamily::kVt, RulerHaystack::kNoise, RulerItem::kWord, RulerItem::kNumber, 1, 1, 1, 30},
    {RulerTask::kCwe, "cwe", RulerFamily::kCwe, RulerHaystack::kWords, RulerItem::kWord, RulerItem::kWord, 1, 1, 1, 120},
    {RulerTask::kFwe, "fwe", RulerFamily::kFwe, RulerHaystack::kWords, RulerItem::kWord, RulerItem::kWord, 1, 1, 1, 50},
    {RulerTask::kPasskey, "passkey", RulerFamily::kPasskey, RulerHaystack::kNoise, RulerItem::kWord, RulerItem::kNumber, 1, 1, 1, 16, RulerScoring::kFirstNumber},
    {RulerTask::kKvRetrieval, "kv_retrieval", RulerFamily::kKvRetrieval, RulerHaystack::kPairs, RulerItem::kUuid, RulerItem::kUuid, 1, 1, 1, 50},
};

// The passkey filler (POLICIES.md 7), RULER's "repeat" haystack and vt's noise.
// The noise haystack's repeated unit: five short plain sentences (RULER repeats such a line; the
// words here are kvlab's).
constexpr const char* kNoise = "The river is wide. The hill is quiet. The road is long. On we walk. Far and home again.";

// RULER niah.py: needle depths, np.round(np.linspace(0, 100, num=40)).
std::vector<int> ruler_depths() {
  std::vector<int> d;
  for (int i = 0; i < 40; ++i) d.push_back(int(std::nearbyint(100.0 * i / 39.0)));
  return d;
}

uint64_t below(uint64_t& rng, uint64_t n) { return splitmix64(rng) % n; }

// k distinct indices of [0, n), in draw order (a partial Fisher-Yates shuffle).
std::vector<size_t> sample_without_replacement(uint64_t& rng, size_t n, size_t k) {
  std::vector<size_t> all(n);
  for (size_t i = 0; i < n; ++i) all[i] = i;
  for (size_t i = 0; i < k; ++i) std::swap(all[i], all[i + below(rng, n - i)]);
  all.resize(k);
  return all;
}

template <class T>
void shuffle(uint64_t& rng, std::vector<T>& v) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(rng, i)]);
}

// RULER niah.py generate_random_number / _word / _uuid.
std::string random_number(uint64_t& rng, int digits) {
  std::string v(1, char('1' + below(rng, 9)));
  for (int i = 1; i < digits; ++i) v += char('0' + below(rng, 10));
  return v;
}
std::string random_key_word(uint64_t& rng) {
  return kRulerAdjectives[below(rng, kRulerAdjectives.size())] + "-" + kRulerNouns[below(rng, kRulerNouns.size())];
}
// 128 random bits as a version-4 UUID (as Python's uuid.UUID(int=..., version=4)).
std::string random_uuid(uint64_t& rng) {
  uint8_t b[16];
  for (int i = 0; i < 16; i += 8) {
    const uint64_t r = splitmix64(rng);
    for (int j = 0; j < 8; ++j) b[i + j] = uint8_t(r >> (8 * j));
  }
  b[6] = uint8_t((b[6] & 0x0f) | 0x40);
  b[8] = uint8_t((b[8] & 0x3f) | 0x80);
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += hex[b[i] >> 4];
    s += hex[b[i] & 15];
  }
  return s;
}
std::string random_item(uint64_t& rng, RulerItem item) {
  switch (item) {
    case RulerItem::kNumber: return random_number(rng, 7);
    case RulerItem::kWord: return random_key_word(rng);
    case RulerItem::kUuid: return random_uuid(rng);
  }
  return "";
}
const char* item_plural(RulerItem item) {
  return item == RulerItem::kNumber ? "numbers" : item == RulerItem::kWord ? "words" : "uuids";
}
const char* item_singular(RulerItem item) {
  return item == RulerItem::kNumber ? "number" : item == RulerItem::kWord ? "word" : "uuid";
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

struct Fill {
  std::string key, value, query, type, type_one, types, num_v;
};
std::string fill(std::string s, const Fill& f) {
  s = replace_all(s, "{key}", f.key);
  s = replace_all(s, "{value}", f.value);
  s = replace_all(s, "{query}", f.query);
  s = replace_all(s, "{types}", f.types);
  s = replace_all(s, "{type_one}", f.type_one);
  s = replace_all(s, "{type}", f.type);
  s = replace_all(s, "{num_v}", f.num_v);
  return s;
}

// RULER niah.py's query list: "a", "a, and b", "a, b, and c" (', '.join(q[:-1]) + ', and ' + q[-1]).
std::string join_queries(const std::vector<std::string>& q) {
  if (q.size() == 1) return q[0];
  std::string s;
  for (size_t i = 0; i + 1 < q.size(); ++i) s += (i ? ", " : "") + q[i];
  return s + ", and " + q.back();
}

// The haystack stream of a sample: exactly `budget` tokens, and where each unit starts.
struct HayStream {
  std::vector<int32_t> tokens;
  std::vector<int64_t> unit_starts;  // increasing, < budget
};

HayStream fill_units(int64_t budget, const std::function<std::vector<int32_t>()>& next_unit) {
  HayStream h;
  while (int64_t(h.tokens.size()) < budget) {
    const std::vector<int32_t> u = next_unit();
    if (u.empty()) fail("RULER: a haystack unit tokenizes to nothing");
    h.unit_starts.push_back(int64_t(h.tokens.size()));
    h.tokens.insert(h.tokens.end(), u.begin(), u.end());
  }
  h.tokens.resize(size_t(budget));  // the last unit is cut to the budget
  return h;
}

// The essay excerpt: `budget` tokens read cyclically from a sentence start drawn from rng.
HayStream essay_units(const Haystack& essay, int64_t budget, uint64_t& rng, int64_t& offset) {
  HayStream h;
  const size_t n = essay.tokens.size();
  offset = essay.sentence_starts[below(rng, essay.sentence_starts.size())];
  for (int64_t i = 0; i < budget; ++i) {
    const size_t at = size_t(offset + i) % n;
    h.tokens.push_back(essay.tokens[at]);
    if (i == 0 || at == 0 || essay.ends_sentence[(at + n - 1) % n]) h.unit_starts.push_back(i);
  }
  return h;
}

}  // namespace

const std::vector<RulerTaskInfo>& ruler_tasks() { return kTasks; }

const RulerTaskInfo* find_ruler_task(const std::string& name) {
  for (const auto& t : kTasks)
    if (name == t.name) return &t;
  return nullptr;
}

std::string ruler_task_names() {
  std::string s;
  for (const auto& t : kTasks) s += (s.empty() ? "" : ", ") + std::string(t.name);
  return s;
}

uint64_t ruler_sample_seed(uint64_t seed, RulerTask task, int64_t context_length, int sample) {
  uint64_t state = seed;
  uint64_t h = splitmix64(state);
  for (uint64_t part : {uint64_t(0x52554c4552ull) + uint64_t(task), uint64_t(context_length), uint64_t(sample)}) {
    state = h ^ part;
    h = splitmix64(state);
  }
  return h;
}

namespace {

// How an in-context example differs from the sample it precedes (RULER's is_icl).
struct Variant {
  bool bos = true;           // the example follows the sample's BOS
  bool example = true;       // the template's example, if it has one (never inside an example)
  int vt_name_letters = 5;   // variable_tracking.py generate_chains: 3 letters in the example
  int cwe_words = 0;         // > 0: a fixed list of that many words, no padding, length as it comes
  int cwe_freq_cw = 0, cwe_freq_ucw = 0;
};

// The example's stream of a sample's seed (the sample's own draws stay as without an example).
uint64_t example_seed(uint64_t seed) {
  uint64_t state = seed ^ 0x49434c4578616d70ull;  // "ICLExamp"
  return splitmix64(state);
}

RulerSample build_sample(const RulerSource& src, const RulerTaskInfo& task, int prompt_length, int context_length,
                         uint64_t seed, const Variant& v);

// RULER's in-context example of a vt or cwe sample (ruler_tasks.h): its tokens and answer.
// variable_tracking.py sys_vartrack_w_noise_random (the example: max_seq_length 500, then
// `input + " " + answer + "\n\n"` placed before the task's template) and
// common_words_extraction.py generate_input_output (get_example(20, 3, 1) below 4096 tokens,
// get_example(40, 10, 3) from 4096, then `example + answer + "\n"` before the input).
RulerSample build_example(const RulerSource& src, const RulerTaskInfo& task, int context_length, uint64_t seed) {
  const Tokenizer& tok = src.tokenizer;
  Variant v;
  v.bos = false;
  v.example = false;
  std::string sep;
  RulerSample ex;
  if (task.family == RulerFamily::kVt) {
    v.vt_name_letters = 3;
    sep = "\n\n";
    // The names do not depend on the prompt length (drawn before the haystack): a first draw
    // gives the answer's length, the second the prompt that makes the whole exactly 470 tokens.
    const int total = 500 - task.answer_tokens;
    const RulerSample probe = build_sample(src, task, total, 500, seed, v);
    std::string answer;
    for (const auto& r : probe.references) answer += (answer.empty() ? "" : " ") + r;
    const int64_t tail = int64_t(encode_sentence(tok, answer).size() + encode_sentence(tok, sep).size());
    ex = build_sample(src, task, int(total - tail), 500, seed, v);
  } else {
    const bool long_ctx = context_length >= 4096;
    v.cwe_words = long_ctx ? 40 : 20;
    v.cwe_freq_cw = long_ctx ? 10 : 3;
    v.cwe_freq_ucw = long_ctx ? 3 : 1;
    sep = "\n";
    ex = build_sample(src, task, -1, context_length, seed, v);
  }
  std::string answer;
  for (size_t i = 0; i < ex.references.size(); ++i)
    answer += (i ? " " : "") + (task.family == RulerFamily::kCwe ? std::to_string(i + 1) + ". " : "") + ex.references[i];
  for (const std::string& piece : {answer, sep}) {
    const auto t = encode_sentence(tok, piece);
    ex.tokens.insert(ex.tokens.end(), t.begin(), t.end());
  }
  return ex;
}

RulerSample build_sample(const RulerSource& src, const RulerTaskInfo& task, int prompt_length, int context_length,
                         uint64_t seed, const Variant& v) {
  const Tokenizer& tok = src.tokenizer;
  const RulerTemplate& tpl = src.templates.of(task.family);
  uint64_t rng = seed;
  RulerSample s;
  Fill f;

  // The needles (in insertion order) and the references.
  std::vector<std::string> needles;
  std::function<std::vector<int32_t>()> distractor;  // the next haystack unit (noise, needle, pair)
  const auto noise = encode_sentence(tok, kNoise);
  std::vector<int32_t> header;
  if (v.bos && tok.bos_id() >= 0) header.push_back(tok.bos_id());
  if (v.example && tpl.example && (task.family == RulerFamily::kVt || task.family == RulerFamily::kCwe)) {
    const RulerSample ex = build_example(src, task, context_length, example_seed(seed));
    header.insert(header.end(), ex.tokens.begin(), ex.tokens.end());
    s.example_tokens = int(ex.tokens.size());
    s.example_references = ex.references;
  }
  switch (task.family) {
    case RulerFamily::kNiah: {
      // RULER niah.py generate_input_output: num_k = max(num_k, num_q) keys, num_v values each;
      // needles shuffled; num_q keys asked, their values the answers.
      const int num_k = std::max(task.num_keys, task.num_queries);
      std::vector<std::string> keys;
      std::vector<std::vector<std::string>> values;
      f.types = item_plural(task.value);
      f.type_one = item_singular(task.value);
      for (int k = 0; k < num_k; ++k) {
        keys.push_back(random_item(rng, task.key));
        values.emplace_back();
        for (int v = 0; v < task.num_values; ++v) {
          values.back().push_back(random_item(rng, task.value));
          needles.push_back(fill(tpl.needle, Fill{keys.back(), values.back().back(), "", f.types, f.type_one, f.types, ""}));
        }
      }
      shuffle(rng, needles);
      std::vector<std::string> queries;
      for (size_t i : sample_without_replacement(rng, size_t(num_k), size_t(task.num_queries))) {
        queries.push_back(keys[i]);
        for (const auto& v : values[i]) s.references.push_back(v);
      }
      f.query = join_queries(queries);
      const bool one = task.num_queries * task.num_values == 1;
      f.type = one ? f.type_one : f.types;
      if (task.haystack == RulerHaystack::kNeedle) {
        distractor = [&tok, &tpl, &rng, &task, types = f.types] {
          return encode_sentence(tok, fill(tpl.needle, Fill{random_item(rng, task.key), random_item(rng, task.value),
                                                            "", types, types, types, ""}));
        };
      }
      break;
    }
    case RulerFamily::kVt: {
      // RULER variable_tracking.py generate_chains: one chain of num_hops + 1 = 5 distinct
      // five-letter names, "VAR A = 12345" then "VAR B = VAR A", ...; the answer: every name.
      std::vector<std::string> names;
      while (names.size() < 5) {
        std::string n;
        for (int i = 0; i < v.vt_name_letters; ++i) n += char('A' + below(rng, 26));
        if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
      }
      const std::string value = std::to_string(10000 + below(rng, 89999));
      needles.push_back("VAR " + names[0] + " = " + value);
      for (int j = 1; j < 5; ++j) needles.push_back("VAR " + names[size_t(j)] + " = VAR " + names[size_t(j - 1)]);
      s.references = names;
      f.query = value;
      f.num_v = "5";
      break;
    }
    case RulerFamily::kPasskey: {
      // Landmark Attention's passkey: a random integer in [1, 50000].
      const std::string k = std::to_string(1 + below(rng, 50000));
      needles.push_back(fill(tpl.needle, Fill{"", k, "", "", "", "", ""}));
      s.references = {k};
      break;
    }
    case RulerFamily::kKvRetrieval: {
      // InfiniteBench kv_retrieval: UUID key/value pairs; one pair is asked.
      const std::string key = random_uuid(rng), value = random_uuid(rng);
      needles.push_back(fill(tpl.needle, Fill{key, value, "", "", "", "", ""}));
      s.references = {value};
      f.query = key;
      distractor = [&tok, &tpl, &rng] {
        const std::string k = random_uuid(rng), v = random_uuid(rng);
        return encode_sentence(tok, fill(tpl.needle, Fill{k, v, "", "", "", "", ""}));
      };
      break;
    }
    case RulerFamily::kCwe:
    case RulerFamily::kFwe:
      break;
  }
  if (!distractor) distractor = [&noise] { return noise; };

  auto render = [&](const std::string& text) {
    return fill(text, f);
  };
  if (!tpl.intro.empty()) {
    const auto intro = encode_sentence(tok, render(tpl.intro));
    header.insert(header.end(), intro.begin(), intro.end());
  }
  const std::vector<int32_t> tail = encode_sentence(tok, render(tpl.question + tpl.answer_prefix));
  std::vector<std::vector<int32_t>> needle_ids;
  int64_t needle_total = 0;
  for (const auto& n : needles) {
    needle_ids.push_back(encode_sentence(tok, n));
    needle_total += int64_t(needle_ids.back().size());
  }
  const int64_t fixed = int64_t(header.size()) + int64_t(tail.size()) + needle_total;
  // (a fixed cwe list, the example's, has the length it comes to)
  const int64_t budget = v.cwe_words > 0 ? std::numeric_limits<int64_t>::max() : int64_t(prompt_length) - fixed;
  if (budget < 1)
    fail("a prompt of ", prompt_length, " tokens is too short for task ", task.name, ": its fixed parts take ", fixed,
         " tokens (at least ", fixed + 1, ")",
         s.example_tokens ? str_cat(", of which the in-context example ", s.example_tokens) : std::string());
  s.question_tokens = int(tail.size());

  std::vector<int32_t> context;
  if (task.family == RulerFamily::kCwe || task.family == RulerFamily::kFwe) {
    // The list keeps exact counts: the most words whose list fits, then padding.
    const uint64_t list_seed = splitmix64(rng);
    std::vector<std::string> answer;
    std::vector<std::string> pool = kRulerNouns;  // cwe's words
    pool.insert(pool.end(), kRulerAdjectives.begin(), kRulerAdjectives.end());
    pool.insert(pool.end(), kRulerVerbs.begin(), kRulerVerbs.end());
    std::sort(pool.begin(), pool.end());
    pool.erase(std::unique(pool.begin(), pool.end()), pool.end());
    auto build = [&](int64_t n_words) {
      uint64_t r = list_seed ^ (uint64_t(n_words) * 0x9E3779B97F4A7C15ull);
      std::vector<std::string> list;
      answer.clear();
      if (task.family == RulerFamily::kCwe) {
        // RULER common_words_extraction.py: num_cw = 10 words appear freq_cw times, the others
        // freq_ucw times (30 / 3; 6 / 1 below 4096 tokens); "1. w 2. w ..."; answer: the 10.
        const int freq_cw = v.cwe_words > 0 ? v.cwe_freq_cw : context_length < 4096 ? 6 : 30;
        const int freq_ucw = v.cwe_words > 0 ? v.cwe_freq_ucw : context_length < 4096 ? 1 : 3;
        const auto picked = sample_without_replacement(r, pool.size(), size_t(std::min<int64_t>(n_words, int64_t(pool.size()))));
        for (size_t i = 0; i < picked.size(); ++i) {
          const int reps = i < 10 ? freq_cw : freq_ucw;
          if (i < 10) answer.push_back(pool[picked[i]]);
          for (int k = 0; k < reps; ++k) list.push_back(pool[picked[i]]);
        }
        shuffle(r, list);
        for (size_t i = 0; i < list.size(); ++i) list[i] = std::to_string(i + 1) + ". " + list[i];
      } else {
        // RULER freq_words_extraction.py: a vocabulary of context_length / 50 coded words of 6
        // lowercase letters, the first replaced by "..." (noise); word k (1-based rank) appears
        // floor(n * k^-alpha / zeta(alpha)) times, alpha = 2 (zeta(2) = pi^2 / 6); shuffled;
        // answer: ranks 2..4.
        const size_t vocab_size = size_t(std::max(4, context_length / 50));
        std::vector<std::string> vocab;
        while (vocab.size() < vocab_size) {
          std::string w;
          for (int i = 0; i < 6; ++i) w += char('a' + below(r, 26));
          if (std::find(vocab.begin(), vocab.end(), w) == vocab.end()) vocab.push_back(w);
        }
        vocab[0] = "...";
        const double zeta2 = std::numbers::pi * std::numbers::pi / 6.0;
        for (size_t k = 0; k < vocab.size(); ++k) {
          const int64_t cnt = int64_t(double(n_words) * std::pow(double(k + 1), -2.0) / zeta2);
          for (int64_t c = 0; c < cnt; ++c) list.push_back(vocab[k]);
        }
        answer.assign(vocab.begin() + 1, vocab.begin() + 4);
        shuffle(r, list);
      }
      std::vector<int32_t> ids;
      for (const auto& e : list) {
        const auto t = encode_sentence(tok, e);
        ids.insert(ids.end(), t.begin(), t.end());
      }
      return ids;
    };
    // The largest word count whose list fits (doubling, then bisection); lists of larger
    // counts are longer up to the tokens of the drawn words.
    const int64_t min_words = task.family == RulerFamily::kCwe ? 11 : 1;
    if (v.cwe_words > 0) {
      context = build(v.cwe_words);  // the example's list: as it comes, no padding
    } else {
      if (int64_t(build(min_words).size()) > budget)
        fail("a prompt of ", prompt_length, " tokens is too short for task ", task.name, ": its smallest list does not fit",
             s.example_tokens ? str_cat(" beside its in-context example (", s.example_tokens, " tokens)") : std::string());
      // (cwe cannot use more words than its pool holds)
      const int64_t max_words = task.family == RulerFamily::kCwe ? int64_t(pool.size()) : int64_t(1) << 24;
      int64_t lo = min_words, hi = std::min(min_words * 2, max_words);
      while (lo < max_words && int64_t(build(hi).size()) <= budget) lo = hi, hi = std::min(hi * 2, max_words);
      if (lo == max_words) hi = lo;
      while (hi - lo > 1) {  // build(lo) fits, build(hi) does not
        const int64_t mid = (lo + hi) / 2;
        (int64_t(build(mid).size()) <= budget ? lo : hi) = mid;
      }
      context = build(lo);
      if (int64_t(context.size()) > budget) context = build(min_words);  // (non-monotone draw)
      const auto pad = encode_sentence(tok, " ...");
      s.pad_tokens = int(budget - int64_t(context.size()));
      for (int i = 0; i < s.pad_tokens; ++i) context.push_back(pad[size_t(i) % pad.size()]);
    }
    s.references = answer;
  } else {
    const int64_t hay_budget = budget;
    HayStream hay;
    const bool essay = task.haystack == RulerHaystack::kEssay && src.essay;
    if (essay)
      hay = essay_units(*src.essay, hay_budget, rng, s.haystack_offset);
    else
      hay = fill_units(hay_budget, distractor);
    if (!essay && task.haystack == RulerHaystack::kNoise && hay.unit_starts.size() <= needles.size()) {
      // RULER variable_tracking.py: too few noise lines for the chain -> one unit per sentence.
      static const std::vector<std::string> kSentences = {"The river is wide.", "The hill is quiet.",
                                                          "The road is long.", "On we walk.", "Far and home again."};
      size_t next = 0;
      hay = fill_units(hay_budget, [&] { return encode_sentence(tok, kSentences[next++ % kSentences.size()]); });
    }
    // Insertion points (token offsets into the haystack), one per needle, non-decreasing.
    std::vector<int64_t> at;
    if (essay) {
      // RULER niah.py: int(n_sentences * depth / 100) for depths drawn from its 40.
      const std::vector<int> depths = ruler_depths();
      const int64_t m = int64_t(hay.unit_starts.size());
      for (size_t i : sample_without_replacement(rng, depths.size(), needles.size())) {
        const int64_t j = m * depths[i] / 100;
        // The end counts as a boundary only when the cut excerpt ends a sentence.
        const bool clean_end = src.essay->ends_sentence[size_t(s.haystack_offset + hay_budget - 1) % src.essay->tokens.size()];
        at.push_back(j < m ? hay.unit_starts[size_t(j)] : clean_end ? hay_budget : hay.unit_starts[size_t(m - 1)]);
      }
    } else {
      // RULER: random.sample(range(num_haystack), n) -- before distinct units, in order.
      const size_t m = hay.unit_starts.size();
      if (m < needles.size())
        fail("a prompt of ", prompt_length, " tokens is too short for task ", task.name, ": ", m,
             " haystack units for ", needles.size(), " needles");
      for (size_t i : sample_without_replacement(rng, m, needles.size())) at.push_back(hay.unit_starts[i]);
    }
    std::sort(at.begin(), at.end());
    int64_t from = 0;
    for (size_t k = 0; k < needles.size(); ++k) {
      context.insert(context.end(), hay.tokens.begin() + from, hay.tokens.begin() + at[k]);
      from = at[k];
      s.needle_pos.push_back(int64_t(header.size() + context.size()));
      s.needle_tokens.push_back(int64_t(needle_ids[k].size()));
      context.insert(context.end(), needle_ids[k].begin(), needle_ids[k].end());
    }
    context.insert(context.end(), hay.tokens.begin() + from, hay.tokens.end());
  }
  s.query = f.query;
  s.tokens = header;
  s.tokens.insert(s.tokens.end(), context.begin(), context.end());
  s.tokens.insert(s.tokens.end(), tail.begin(), tail.end());
  if (v.cwe_words == 0 && int64_t(s.tokens.size()) != prompt_length)
    fail("RULER: internal error: ", task.name, " prompt has ", s.tokens.size(), " tokens, expected ", prompt_length);
  return s;
}

}  // namespace

RulerSample build_ruler_sample(const RulerSource& src, const RulerTaskInfo& task, int prompt_length, int context_length,
                               uint64_t seed) {
  return build_sample(src, task, prompt_length, context_length, seed, Variant{});
}

}  // namespace kvlab
