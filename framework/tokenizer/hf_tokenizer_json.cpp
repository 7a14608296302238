#include "framework/tokenizer/hf_tokenizer_json.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "framework/core/error.h"
#include "framework/core/json_file.h"

namespace kvlab {
namespace {

using Json = nlohmann::json;

// A JSON string with the characters regex syntax gives meaning to escaped (HF Split{String}).
std::string regex_escape(const std::string& literal) {
  static const std::string kMeta = R"(\^$.|?*+()[]{}-/)";
  std::string out;
  for (const char c : literal) {
    if (kMeta.find(c) != std::string::npos) out += '\\';
    out += c;
  }
  return out;
}

class TokenizerJsonReader {
 public:
  explicit TokenizerJsonReader(const std::filesystem::path& path) : path_(path), name_(path.string()) {}

  BpeVocab read() {
    const Json root = read_json_file(path_);
    if (!root.is_object()) bad("", "a JSON object at the top level");
    read_model(field(root, "model", "model"));
    if (root.contains("added_tokens")) read_added(root["added_tokens"]);
    place_tokens();
    if (root.contains("normalizer") && !root["normalizer"].is_null())
      read_normalizer(root["normalizer"], "normalizer");
    if (!root.contains("pre_tokenizer") || root["pre_tokenizer"].is_null())
      bad("pre_tokenizer", "a ByteLevel pre-tokenizer (only byte-level BPE is supported; for a "
                           "SentencePiece vocabulary use tokenizer.model)");
    read_pre_tokenizer(root["pre_tokenizer"], "pre_tokenizer");
    if (!saw_byte_level_)
      bad("pre_tokenizer", "a ByteLevel step (only byte-level BPE is supported; for a SentencePiece "
                           "vocabulary use tokenizer.model)");
    if (root.contains("post_processor") && !root["post_processor"].is_null())
      read_post_processor(root["post_processor"], "post_processor");
    read_config(path_.parent_path() / "tokenizer_config.json");
    return std::move(vocab_);
  }

 private:
  [[noreturn]] void bad(const std::string& key, const std::string& expected) {
    fail(name_, ": ", key.empty() ? std::string("top level") : "key '" + key + "'", ": expected ", expected);
  }
  const Json& field(const Json& obj, const char* name, const std::string& key) {
    if (!obj.is_object() || !obj.contains(name)) bad(key, "to be present");
    return obj[name];
  }
  std::string string_at(const Json& obj, const char* name, const std::string& key) {
    const Json& v = field(obj, name, key);
    if (!v.is_string()) bad(key, "a string");
    return v.get<std::string>();
  }

  void read_model(const Json& model) {
    const std::string type = model.is_object() ? model.value("type", "BPE") : "";
    if (type != "BPE") bad("model.type", "\"BPE\" (got \"" + type + "\")");
    const Json& vocab = field(model, "vocab", "model.vocab");
    if (!vocab.is_object() || vocab.empty()) bad("model.vocab", "a non-empty object {token: id}");
    for (const auto& [token, id] : vocab.items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > (1 << 24))
        bad("model.vocab[\"" + token + "\"]", "an id in [0, 2^24]");
      listed_.emplace_back(id.get<size_t>(), token);
    }
    const Json& merges = field(model, "merges", "model.merges");
    if (!merges.is_array()) bad("model.merges", "an array");
    vocab_.merges.reserve(merges.size());
    for (size_t k = 0; k < merges.size(); ++k) {
      const Json& m = merges[k];
      const std::string key = "model.merges[" + std::to_string(k) + "]";
      if (m.is_string()) {  // "left right" (the older layout)
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ', 1);
        if (space == std::string::npos) bad(key, "\"left right\"");
        vocab_.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        vocab_.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        bad(key, "\"left right\" or [\"left\", \"right\"]");
      }
    }
    vocab_.ignore_merges = model.value("ignore_merges", false);
    if (model.value("byte_fallback", false)) bad("model.byte_fallback", "false (byte-level BPE)");
  }

  void read_added(const Json& added) {
    if (!added.is_array()) bad("added_tokens", "an array");
    for (size_t k = 0; k < added.size(); ++k) {
      const std::string key = "added_tokens[" + std::to_string(k) + "]";
      const Json& t = added[k];
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || t["id"].get<int64_t>() < 0 ||
          t["id"].get<int64_t>() > (1 << 24))
        bad(key + ".id", "an id in [0, 2^24]");
      BpeAddedToken token;
      token.id = t["id"].get<int32_t>();
      token.content = string_at(t, "content", key + ".content");
      token.special = t.value("special", false);
      vocab_.added.push_back(std::move(token));
    }
  }

  // The id -> token table is dense, sized by the largest id. So that one corrupt id cannot size
  // it (2147483647 would ask for 64 GiB), every id must be below 2 x the number of tokens the
  // file lists (model.vocab and added_tokens) + 256; real vocabularies have no gaps at all.
  void place_tokens() {
    const size_t limit = 2 * (listed_.size() + vocab_.added.size()) + 256;
    size_t n = 0;
    for (const auto& [id, token] : listed_) {
      if (id >= limit)
        bad("model.vocab[\"" + token + "\"]", str_cat("an id below ", limit, " (2 x the ", listed_.size() + vocab_.added.size(),
                                                      " tokens listed + 256), got ", id));
      n = std::max(n, id + 1);
    }
    for (size_t k = 0; k < vocab_.added.size(); ++k) {
      const BpeAddedToken& t = vocab_.added[k];
      if (static_cast<size_t>(t.id) >= limit)
        bad(str_cat("added_tokens[", k, "].id"), str_cat("an id below ", limit, " (2 x the ",
                                                        listed_.size() + vocab_.added.size(), " tokens listed + 256), got ", t.id));
    }
    vocab_.tokens.resize(n);
    for (auto& [id, token] : listed_) vocab_.tokens[id] = std::move(token);
    listed_.clear();
  }

  // null, NFC, or a Sequence of NFC: anything else would change ids in ways not implemented.
  void read_normalizer(const Json& normalizer, const std::string& key) {
    const std::string type = string_at(normalizer, "type", key + ".type");
    if (type == "NFC") {
      vocab_.nfc = true;
    } else if (type == "Sequence") {
      const Json& steps = field(normalizer, "normalizers", key + ".normalizers");
      if (!steps.is_array()) bad(key + ".normalizers", "an array");
      for (size_t k = 0; k < steps.size(); ++k)
        read_normalizer(steps[k], key + ".normalizers[" + std::to_string(k) + "]");
    } else {
      bad(key + ".type", "null or \"NFC\" (normalizer \"" + type + "\" is not supported)");
    }
  }

  void read_pre_tokenizer(const Json& pre, const std::string& key) {
    const std::string type = string_at(pre, "type", key + ".type");
    if (type == "Sequence") {
      const Json& steps = field(pre, "pretokenizers", key + ".pretokenizers");
      if (!steps.is_array()) bad(key + ".pretokenizers", "an array");
      for (size_t k = 0; k < steps.size(); ++k)
        read_pre_tokenizer(steps[k], key + ".pretokenizers[" + std::to_string(k) + "]");
    } else if (type == "ByteLevel") {
      saw_byte_level_ = true;
      vocab_.add_prefix_space = pre.value("add_prefix_space", false);
      if (pre.value("use_regex", true)) vocab_.pre_patterns.emplace_back(kGpt2Pattern);
    } else if (type == "Split") {
      const Json& pattern = field(pre, "pattern", key + ".pattern");
      if (pattern.contains("Regex")) vocab_.pre_patterns.push_back(string_at(pattern, "Regex", key + ".pattern.Regex"));
      else vocab_.pre_patterns.push_back(regex_escape(string_at(pattern, "String", key + ".pattern.String")));
      if (pre.value("behavior", "Isolated") != "Isolated") bad(key + ".behavior", "\"Isolated\"");
      if (pre.value("invert", false)) bad(key + ".invert", "false");
    } else if (type == "Digits") {
      vocab_.pre_patterns.emplace_back(pre.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)");
    } else {
      bad(key + ".type", "ByteLevel, Split, Digits or Sequence (got \"" + type + "\")");
    }
  }

  // TemplateProcessing whose single-sequence template starts with a special token: that token
  // is the BOS the model expects first.
  void read_post_processor(const Json& post, const std::string& key) {
    const std::string type = post.value("type", "");
    if (type == "Sequence" && post.contains("processors") && post["processors"].is_array()) {
      for (size_t k = 0; k < post["processors"].size(); ++k)
        read_post_processor(post["processors"][k], key + ".processors[" + std::to_string(k) + "]");
      return;
    }
    if (type != "TemplateProcessing" || !post.contains("single") || !post["single"].is_array() ||
        post["single"].empty())
      return;
    const Json& first = post["single"][0];
    if (!first.contains("SpecialToken")) return;
    const std::string name = string_at(first["SpecialToken"], "id", key + ".single[0].SpecialToken.id");
    const int32_t id = find_token(name);
    if (id < 0) bad(key + ".single[0]", "a known token (\"" + name + "\" is not in the vocabulary)");
    vocab_.bos_id = id;
    vocab_.add_bos = true;
  }

  int32_t find_token(const std::string& content) const {
    for (const BpeAddedToken& t : vocab_.added)
      if (t.content == content) return t.id;
    for (size_t i = 0; i < vocab_.tokens.size(); ++i)
      if (vocab_.tokens[i] == content) return static_cast<int32_t>(i);
    return -1;
  }

  // tokenizer_config.json: optional; bos_token / eos_token as a string or {"content": ...}.
  void read_config(const std::filesystem::path& config_path) {
    if (!std::filesystem::exists(config_path)) return;
    const Json config = read_json_file(config_path);
    const auto token_of = [&](const char* name) -> int32_t {
      if (!config.contains(name)) return -2;
      const Json& v = config[name];
      if (v.is_null()) return -1;
      const std::string content = v.is_string() ? v.get<std::string>() : v.value("content", "");
      return find_token(content);
    };
    if (const int32_t bos = token_of("bos_token"); bos != -2) vocab_.bos_id = bos;
    if (const int32_t eos = token_of("eos_token"); eos != -2) vocab_.eos_id = eos;
    if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean())
      vocab_.add_bos = config["add_bos_token"].get<bool>();
  }

  std::filesystem::path path_;
  std::string name_;
  BpeVocab vocab_;
  bool saw_byte_level_ = false;
  std::vector<std::pair<size_t, std::string>> listed_;  // model.vocab as (id, token), until place_tokens()
};

}  // namespace

std::unique_ptr<BpeTokenizer> load_hf_tokenizer_json(const std::filesystem::path& path) {
  BpeVocab vocab;
  try {
    vocab = TokenizerJsonReader(path).read();
  } catch (const Json::exception& e) {  // a value of the wrong JSON type somewhere
    fail(path.string(), ": unexpected JSON content: ", e.what());
  }
  return std::make_unique<BpeTokenizer>(std::move(vocab), path.string());
}

}  // namespace kvlab
