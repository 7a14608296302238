#include "framework/tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <queue>

#include "framework/core/error.h"
#include "framework/tokenizer/byte_level.h"
#include "framework/tokenizer/unicode_nfc.h"
#include "framework/tokenizer/utf8.h"

namespace kvlab {

BpeTokenizer::BpeTokenizer(BpeVocab vocab, const std::string& source)
    : Tokenizer("bpe", source), pre_(vocab.pre_patterns, source) {
  add_prefix_space_ = vocab.add_prefix_space;
  ignore_merges_ = vocab.ignore_merges;
  nfc_ = vocab.nfc;
  add_bos_ = vocab.add_bos;

  // The vocabulary spans the model's tokens and the added tokens (which may extend it).
  size_t n = vocab.tokens.size();
  for (const BpeAddedToken& t : vocab.added) {
    if (t.id < 0) fail(source, ": added token '", t.content, "' has negative id ", t.id);
    // The loaders bound ids by what their file lists; this is the last line against a table
    // sized from one number.
    if (t.id > (1 << 24)) fail(source, ": added token '", t.content, "' has id ", t.id, ", above 2^24");
    n = std::max(n, static_cast<size_t>(t.id) + 1);
  }
  if (n == 0) fail(source, ": empty vocabulary");
  tokens_ = std::move(vocab.tokens);
  tokens_.resize(n);
  bytes_.resize(n);
  token_to_id_.reserve(n);
  for (size_t id = 0; id < tokens_.size(); ++id) {
    const std::string& token = tokens_[id];
    if (token.empty()) continue;
    token_to_id_.emplace(token, static_cast<int32_t>(id));
    if (!byte_level::decode(token, &bytes_[id])) bytes_[id] = token;  // not byte-level: literal
  }
  for (const BpeAddedToken& t : vocab.added) {
    if (t.content.empty()) fail(source, ": added token ", t.id, " has empty content");
    tokens_[t.id] = t.content;
    bytes_[t.id] = t.special ? "" : t.content;  // special tokens are invisible in decoded text
    added_.push_back(t);
    added_first_byte_[static_cast<uint8_t>(t.content[0])] = true;
  }
  std::stable_sort(added_.begin(), added_.end(),
                   [](const auto& a, const auto& b) { return a.content.size() > b.content.size(); });

  const auto& table = byte_level::byte_to_codepoint();
  for (int b = 0; b < 256; ++b) {
    std::string spelled;
    utf8::append(spelled, table[b]);
    const auto it = token_to_id_.find(spelled);
    // Some real vocabularies lack a few bytes that text hardly holds (SmolLM2: 21 of them, C0
    // controls such as 0x04 and bytes that are never or almost never in UTF-8, 0xC0, 0xF1,
    // 0xF5-0xFF). Such a byte is kept as a symbol that merges with nothing and is dropped from
    // the output, as llama.cpp's BPE tokenizer does. A vocabulary without every printable
    // ASCII byte is not byte-level at all.
    if (it == token_to_id_.end() && b >= 0x20 && b <= 0x7E)
      fail(source, ": not a byte-level BPE vocabulary: no token for byte 0x", std::hex, b, " ('", spelled, "')");
    byte_token_[b] = it == token_to_id_.end() ? kNoToken : it->second;
  }

  merges_.reserve(vocab.merges.size());
  for (size_t rank = 0; rank < vocab.merges.size(); ++rank) {
    const auto& [left, right] = vocab.merges[rank];
    const auto l = token_to_id_.find(left), r = token_to_id_.find(right),
               m = token_to_id_.find(left + right);
    if (l == token_to_id_.end() || r == token_to_id_.end() || m == token_to_id_.end())
      fail(source, ": merge ", rank, " ('", left, "' '", right, "') names a token missing from the vocabulary");
    // A repeated pair keeps its first (best) rank, as in HF tokenizers.
    merges_.emplace(pair_key(l->second, r->second), Merge{static_cast<int32_t>(rank), m->second});
  }

  const auto valid_or_none = [&](int32_t id) { return id >= 0 && static_cast<size_t>(id) < n ? id : -1; };
  bos_id_ = valid_or_none(vocab.bos_id);
  eos_id_ = valid_or_none(vocab.eos_id);
  add_bos_ = add_bos_ && bos_id_ >= 0;
}

int BpeTokenizer::match_added(std::string_view text, size_t pos, bool allow_special) const {
  if (!added_first_byte_[static_cast<uint8_t>(text[pos])]) return -1;
  for (size_t k = 0; k < added_.size(); ++k) {
    const BpeAddedToken& t = added_[k];
    if ((allow_special || !t.special) && text.compare(pos, t.content.size(), t.content) == 0)
      return static_cast<int>(k);
  }
  return -1;
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, const EncodeOptions& opts) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (opts.add_bos && bos_id_ >= 0) out.push_back(bos_id_);
  size_t segment_begin = 0;
  if (!added_.empty()) {
    for (size_t pos = 0; pos < text.size();) {
      const int k = match_added(text, pos, opts.parse_special);
      if (k < 0) {
        ++pos;
        continue;
      }
      encode_text(text.substr(segment_begin, pos - segment_begin), segment_begin == 0, out);
      out.push_back(added_[k].id);
      pos += added_[k].content.size();
      segment_begin = pos;
    }
  }
  encode_text(text.substr(segment_begin), segment_begin == 0, out);
  return out;
}

void BpeTokenizer::encode_text(std::string_view text, bool at_start, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string normalized;
  if (nfc_) {
    normalized = nfc_normalize(text);
    text = normalized;
  }
  std::string prefixed;
  if (add_prefix_space_ && at_start && text[0] != ' ') {
    prefixed = " " + std::string(text);
    text = prefixed;
  }
  std::vector<std::string_view> words;
  pre_.split(text, words);
  for (const std::string_view word : words) encode_word(word, out);
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() == 1) {
    if (const int32_t id = byte_token_[static_cast<uint8_t>(word[0])]; id != kNoToken) out.push_back(id);
    return;
  }
  if (ignore_merges_) {
    const auto it = token_to_id_.find(byte_level::encode(word));
    if (it != token_to_id_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const std::string key(word);
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = cache_.find(key);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_word(word, out);
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() >= kMaxCachedWords) cache_.clear();
  cache_.emplace(key, std::vector<int32_t>(out.begin() + first, out.end()));
}

void BpeTokenizer::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  // Symbols form a doubly linked list over positions 0..n-1; a merged symbol keeps its left
  // position and its right neighbour is unlinked (len 0 marks it dead).
  const int n = static_cast<int>(word.size());
  if (n == 0) return;
  std::vector<int32_t> ids(n);
  std::vector<int> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int i = 0; i < n; ++i) {
    ids[i] = byte_token_[static_cast<uint8_t>(word[i])];
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  // Candidate merges of the pair starting at `pos`, ordered by (rank, pos): the lowest rank
  // first, leftmost among equal ranks. Entries go stale when a neighbour changes; they are
  // checked against the current ids when popped.
  struct Candidate {
    int32_t rank;
    int pos;
    int32_t left_id, right_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  const auto push_pair = [&](int left) {
    if (left < 0 || next[left] < 0) return;
    const auto it = merges_.find(pair_key(ids[left], ids[next[left]]));
    if (it != merges_.end()) heap.push({it->second.rank, left, ids[left], ids[next[left]]});
  };
  for (int i = 0; i + 1 < n; ++i) push_pair(i);

  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int right = next[c.pos];
    if (!alive[c.pos] || right < 0 || ids[c.pos] != c.left_id || ids[right] != c.right_id) continue;
    ids[c.pos] = merges_.at(pair_key(c.left_id, c.right_id)).merged_id;
    alive[right] = false;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    push_pair(prev[c.pos]);
    push_pair(c.pos);
  }
  for (int i = 0; i >= 0; i = next[i])
    if (ids[i] != kNoToken) out.push_back(ids[i]);  // a byte without a token (see the constructor)
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (const int32_t id : ids) {
    check_token_id(source_, id, vocab_size());
    out += bytes_[id];
  }
  return out;
}

}  // namespace kvlab
