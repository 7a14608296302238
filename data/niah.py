"""Needle-in-a-haystack prompts and scoring for kvlab-tiny (PyTorch side).

Prompt (as kvlab's evals/niah.cpp builds it): BOS + a haystack excerpt starting at a sentence
start, with the needle sentence "The special magic number is {v}." inserted at
floor(n_hay * depth / 100) moved back to the nearest sentence end (a token whose text ends with
'.', '!' or '?'; depth 100 appends at the end), then "What is the special magic number? The
special magic number is". The model decodes greedily; the trial is correct when the first run of
digits in the decoded text equals v (7 digits) -- decided exactly with one teacher-forced pass
(score_trial). Values come from a seeded RNG; evaluation values are multiples of 11 and training
values never are, so evaluation numbers are held out.
"""
import re

import numpy as np
import torch

NEEDLE = "The special magic number is {v}."
QUESTION = "What is the special magic number? The special magic number is"
# Training-only templates (evaluation's one is included in training too).
TRAIN_TEMPLATES = [
    (NEEDLE, QUESTION),
    ("The secret code is {v}.", "What is the secret code? The secret code is"),
    ("The pass key is {v}. Remember it. {v} is the pass key.", "What is the pass key? The pass key is"),
    ("Note that the special magic number is {v}.", "What is the special magic number? The special magic number is"),
    ("The access number for the archive is {v}.", "Which access number was given for the archive? The access number for the archive is"),
]
ANSWER_TOKENS = 9  # "▁" + 7 digits + "."


def eval_value(rng) -> int:
    return int(rng.integers(1_000_000 // 11 + 1, 9_999_999 // 11 + 1)) * 11


def train_value(rng) -> int:
    while True:
        v = int(rng.integers(1_000_000, 10_000_000))
        if v % 11:
            return v


def sentence_end_ids(sp):
    """[vocab] bool: the piece, trailing white space removed, ends with '.', '!' or '?'
    (kvlab's evals/niah.cpp rule)."""
    def text(i):  # byte tokens "<0x3F>" stand for their byte
        p = sp.id_to_piece(i)
        return chr(int(p[3:5], 16)) if sp.is_byte(i) else p
    return np.array([text(i).rstrip().endswith((".", "!", "?")) for i in range(sp.get_piece_size())])


def sentence_start(hay_stream, ends, rng, span):
    """A random index that follows a sentence end and leaves `span` tokens after it."""
    while True:
        i = int(rng.integers(1, len(hay_stream) - span))
        if ends[hay_stream[i - 1]]:
            return i


def insertion_index(hay, depth, ends):
    """floor(n*depth/100) moved back to just after a sentence end (0 if none)."""
    n = len(hay)
    if depth >= 100:
        return n
    i = (n * depth) // 100
    while i > 0 and not ends[hay[i - 1]]:
        i -= 1
    return i


def build_prompt(sp, hay_stream, start, length, depth, value, ends, template=(NEEDLE, QUESTION)):
    """Returns (token list of exactly `length` tokens, needle token position)."""
    needle = sp.encode(template[0].format(v=value))
    question = sp.encode(template[1])
    n_hay = length - 1 - len(needle) - len(question)
    hay = [int(t) for t in hay_stream[start:start + n_hay]]
    i = insertion_index(hay, depth, ends)
    toks = [sp.bos_id()] + hay[:i] + needle + hay[i:] + question
    assert len(toks) == length
    return toks, 1 + i


@torch.no_grad()
def greedy(model, toks, n_new):
    """Greedy decoding by re-running the full prefix (exact, simple; prompts are short)."""
    toks = list(toks)
    out = []
    for _ in range(n_new):
        logits = model(torch.tensor([toks]))[0, -1]
        nxt = int(logits.argmax())
        out.append(nxt)
        toks.append(nxt)
    return out


def first_number(text):
    m = re.search(r"\d+", text)
    return m.group(0) if m else ""


def score_trial(model, sp, toks, value):
    """One forward pass decides greedy exact match: greedy decoding produces "▁" + the 7 digits
    and then a non-digit exactly when, along that path, every argmax equals the path's next
    token and the argmax after the last digit is not a digit. Returns (correct, answer text
    of the greedy path up to its first divergence + the divergent token)."""
    answer = sp.encode(str(value))                 # ["▁", d1..d7]
    full = torch.tensor([list(toks) + answer])
    with torch.no_grad():
        pred = model(full)[0, len(toks) - 1:].argmax(-1).tolist()   # predictions for answer + 1
    got = []
    for i, a in enumerate(answer):
        got.append(pred[i])
        if pred[i] != a:
            break
    else:
        got.append(pred[len(answer)])
    text = sp.decode(got)
    correct = got[:len(answer)] == answer and not sp.id_to_piece(got[-1]).lstrip("\u2581")[:1].isdigit()
    return correct, text


@torch.no_grad()
def evaluate(model, sp, hay_stream, lengths, depths, trials_per_cell=1, seed=12345, log=None):
    """Full-attention NIAH accuracy. Returns {length: {depth: accuracy}} and per-trial records."""
    rng = np.random.default_rng(seed)
    ends = sentence_end_ids(sp)
    table, records = {}, []
    for length in lengths:
        table[length] = {}
        for depth in depths:
            ok = 0
            for _ in range(trials_per_cell):
                value = eval_value(rng)
                start = sentence_start(hay_stream, ends, rng, length)
                toks, pos = build_prompt(sp, hay_stream, start, length, depth, value, ends)
                correct, ans = score_trial(model, sp, toks, value)
                ok += correct
                records.append(dict(length=length, depth=depth, value=value, needle_pos=pos,
                                    prompt_tokens=len(toks), answer=ans, correct=bool(correct)))
            table[length][depth] = ok / trials_per_cell
        if log:
            log(f"niah L={length}: " + " ".join(f"{d}%:{a:.2f}" for d, a in table[length].items())
                + f" mean {np.mean(list(table[length].values())):.3f}")
    return table, records
