"""An independent byte-level BPE reference for GPT-2, written from the algorithm (not from kvlab's
C++): it reads GPT-2's vocab.json + merges.txt (not tokenizer.json, which kvlab reads) and uses
python3-regex for the pre-tokenizer.

Algorithm, per text:
  1. Cut the bytes into maximal runs of valid UTF-8 and maximal runs of invalid bytes (kvlab's
     definition for invalid input; each invalid run is one word).
  2. Valid runs are split by GPT-2's regex; matches and any unmatched gaps are words.
  3. Each word's bytes are spelled in the byte-level alphabet (bytes_to_unicode below), then the
     adjacent pair with the lowest merge rank is merged everywhere in the word (left to right,
     non-overlapping), repeatedly, until no adjacent pair has a rank.
  4. Each resulting symbol is looked up in vocab.json.
"""

import json

import regex

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def byte_alphabet():
    """byte -> one printable character: printable Latin-1 bytes stand for themselves, the 68
    others take U+0100, U+0101, ... in byte order."""
    printable = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table, shifted = {}, 0x100
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(shifted)
            shifted += 1
    return table


def utf8_runs(data):
    """[(is_valid, bytes)] maximal runs of valid UTF-8 / invalid bytes, in order."""
    runs, pos = [], 0
    while pos < len(data):
        try:
            data[pos:].decode("utf-8")
            runs.append((True, data[pos:]))
            break
        except UnicodeDecodeError as e:
            if e.start > 0:
                runs.append((True, data[pos:pos + e.start]))
            bad = data[pos + e.start:pos + e.end]
            if runs and not runs[-1][0]:
                runs[-1] = (False, runs[-1][1] + bad)
            else:
                runs.append((False, bad))
            pos += e.end
    return runs


class Gpt2Bpe:
    def __init__(self, vocab_json, merges_txt):
        with open(vocab_json, encoding="utf-8") as f:
            self.vocab = json.load(f)
        with open(merges_txt, encoding="utf-8") as f:
            lines = [l.rstrip("\n") for l in f if l.strip() and not l.startswith("#version")]
        self.rank = {tuple(l.split(" ")): r for r, l in enumerate(lines)}
        self.alphabet = byte_alphabet()
        self.pattern = regex.compile(GPT2_PATTERN)
        self.cache = {}

    def words(self, data):
        for valid, run in utf8_runs(data):
            if not valid:
                yield run
                continue
            text, last = run.decode("utf-8"), 0
            for m in self.pattern.finditer(text):
                if m.start() > last:
                    yield text[last:m.start()].encode("utf-8")
                if m.end() > m.start():
                    yield m.group().encode("utf-8")
                last = max(last, m.end())
            if last < len(text):
                yield text[last:].encode("utf-8")

    def merge(self, word_bytes):
        if word_bytes in self.cache:
            return self.cache[word_bytes]
        symbols = [self.alphabet[b] for b in word_bytes]
        while len(symbols) > 1:
            ranked = [(self.rank.get(p, None), p) for p in zip(symbols, symbols[1:])]
            ranked = [(r, p) for r, p in ranked if r is not None]
            if not ranked:
                break
            best = min(ranked)[1]
            merged, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        ids = [self.vocab[s] for s in symbols]
        self.cache[word_bytes] = ids
        return ids

    def encode(self, data):
        ids = []
        for w in self.words(data):
            ids += self.merge(w)
        return ids
