#!/usr/bin/python3
"""Train kvlab-tiny's learned parts around its hand-wired retrieval circuit (CPU, one thread).

Start: the wired circuit (kvlab_tiny.wire) plus a low-rank bigram fitted to the training
split's counts in the learned embedding / output-head dims (kvlab_tiny.fit_bigram).
Data per step: plain language-modelling windows of the training split mixed with needle
sequences (a training value inserted into training prose with one of several templates,
question, answer "▁"+7 digits+"."; answer tokens weighted kAnswerWeight). Lengths cycle
256/256/512/1024 at ~4k tokens per step. AdamW (no weight decay), cosine schedule over the time
budget. Frozen (wired) entries are kept by gradient masks (data/kvlab_tiny.py).

Every --eval-every steps: validation loss, teacher-forced answer-digit accuracy, quick NIAH on
held-out text; one line per eval in <work>/train_log.jsonl; checkpoint <work>/ckpt.pt.

Stops early (after a final evaluation and checkpoint) when <work>/STOP exists.

Usage: data/train.py --work data/work --minutes 45 [--resume]
"""
import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kvlab_tiny as kt  # noqa: E402
import niah  # noqa: E402

kAnswerWeight = 5.0
kNeedleFraction = 0.25
kSchedule = [(16, 256), (16, 256), (8, 512), (4, 1024)]   # (batch, length) cycled per step


def load_stream(sp, path: Path, cache: Path) -> np.ndarray:
    if cache.exists():
        return np.load(cache)
    docs = path.read_text("utf-8").split("\n\f\n")
    ids = np.concatenate([np.array(sp.encode(d.strip()), dtype=np.int32) for d in docs if d.strip()])
    np.save(cache, ids)
    return ids


def needle_sequence(sp, stream, T, rng, ends):
    """(tokens [T], weights [T]) for one training needle sequence; weight on answer targets."""
    needle_t, question_t = niah.TRAIN_TEMPLATES[int(rng.integers(len(niah.TRAIN_TEMPLATES)))]
    v = niah.train_value(rng)
    needle = sp.encode(needle_t.format(v=v))
    question = sp.encode(question_t)
    answer = sp.encode(f"{v}.")
    n_hay = T - 1 - len(needle) - len(question) - len(answer)
    start = int(rng.integers(0, len(stream) - n_hay))
    hay = list(stream[start:start + n_hay])
    i = niah.insertion_index(hay, int(rng.integers(0, 101)), ends)
    toks = [sp.bos_id()] + hay[:i] + needle + hay[i:] + question + answer
    w = np.ones(T, dtype=np.float32)
    w[T - len(answer):] = kAnswerWeight      # weights index the predicted token position
    return np.array(toks, dtype=np.int64), w


def lm_sequence(sp, stream, T, rng):
    start = int(rng.integers(0, len(stream) - T))
    toks = np.concatenate([[sp.bos_id()], stream[start:start + T - 1]]).astype(np.int64)
    return toks, np.ones(T, dtype=np.float32)


def make_batch(sp, stream, B, T, rng, ends, needle_fraction=kNeedleFraction):
    seqs = [needle_sequence(sp, stream, T, rng, ends) if rng.random() < needle_fraction
            else lm_sequence(sp, stream, T, rng) for _ in range(B)]
    toks = torch.tensor(np.stack([s[0] for s in seqs]))
    w = torch.tensor(np.stack([s[1] for s in seqs]))
    return toks, w


def weighted_loss(logits, toks, w):
    """Next-token CE: position p predicts toks[p+1] with weight w[p+1]."""
    nll = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), toks[:, 1:].reshape(-1),
                          reduction="none")
    ww = w[:, 1:].reshape(-1)
    return (nll * ww).sum() / ww.sum(), nll


@torch.no_grad()
def validation(model, sp, valid, ends, rng_seed=7):
    """Mean NLL on 16 fixed validation windows of 512 and answer-digit accuracy on 16 fixed
    validation needle sequences of 512 (teacher forced)."""
    rng = np.random.default_rng(rng_seed)
    toks, _ = make_batch(sp, valid, 16, 512, rng, ends, needle_fraction=0.0)
    logits = model(toks)
    nll = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), toks[:, 1:].reshape(-1)).item()
    toks, w = make_batch(sp, valid, 16, 512, rng, ends, needle_fraction=1.0)
    pred = model(toks)[:, :-1].argmax(-1)
    sel = w[:, 1:] > 1
    digit_acc = (pred[sel] == toks[:, 1:][sel]).float().mean().item()
    return nll, digit_acc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = Path(__file__).resolve().parent
    ap.add_argument("--work", type=Path, default=here / "work")
    ap.add_argument("--minutes", type=float, default=45.0)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=150)
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)

    sp = spm.SentencePieceProcessor(model_file=str(args.work / "tokenizer" / "tokenizer.model"))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    train = load_stream(sp, args.work / "corpus" / "train.txt", args.work / "train_ids.npy")
    valid = load_stream(sp, args.work / "corpus" / "valid.txt", args.work / "valid_ids.npy")
    heldout = load_stream(sp, here / "eval" / "heldout.txt", args.work / "heldout_ids.npy")
    ends = niah.sentence_end_ids(sp)

    cfg = kt.Config()
    model = kt.TinyLlama(cfg)
    masks = kt.wire(model, pieces, seed=args.seed)
    if not args.resume:
        kt.apply_bigram_init(model, *kt.fit_bigram(train, cfg, seed=args.seed,
                                                   log=lambda m: print(m, flush=True)))
    step, elapsed_before, tokens_seen = 0, 0.0, 0
    ckpt_path = args.work / "ckpt.pt"
    params = dict(model.named_parameters())
    for n, p in params.items():
        p.requires_grad_(bool(masks[n].any()))
    trainable = [p for n, p in params.items() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    if args.resume and ckpt_path.exists():
        ck = torch.load(ckpt_path)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, elapsed_before, tokens_seen = ck["step"], ck["elapsed"], ck["tokens"]
        rng = np.random.default_rng(args.seed + step)
    n_params = sum(p.numel() for p in model.parameters())
    n_train = int(sum(masks[n].sum().item() for n in params))
    log_path = args.work / "train_log.jsonl"
    print(f"params {n_params} trainable {n_train} train tokens {len(train)}", flush=True)

    budget = args.minutes * 60
    t0 = time.time()
    warmup = 50
    while True:
        el = time.time() - t0
        frac = min(1.0, (elapsed_before + el) / (elapsed_before + budget))
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        B, T = kSchedule[step % len(kSchedule)]
        toks, w = make_batch(sp, train, B, T, rng, ends)
        logits = model(toks)
        loss, _ = weighted_loss(logits, toks, w)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for n, p in params.items():
            if p.grad is not None:
                p.grad.mul_(masks[n])
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        kt.clamp_learned_embeddings(model)
        step += 1
        tokens_seen += B * T
        done = el >= budget or (args.work / "STOP").exists()
        if step % 10 == 0 or step <= 3:
            print(f"step {step} T {T} loss {loss.item():.3f} lr {lr:.2e} "
                  f"tok/s {tokens_seen / (elapsed_before + el + 1e-9):.0f}", flush=True)
        if step % args.eval_every == 0 or done:
            model.eval()
            vnll, dacc = validation(model, sp, valid, ends)
            table, _ = niah.evaluate(model, sp, heldout, [256, 1024], [0, 50, 100], seed=step)
            model.train()
            rec = dict(step=step, tokens=tokens_seen, minutes=(elapsed_before + time.time() - t0) / 60,
                       train_loss=loss.item(), valid_nll=vnll, valid_ppl=math.exp(vnll),
                       answer_digit_acc=dacc,
                       niah={str(L): float(np.mean(list(d.values()))) for L, d in table.items()})
            with open(log_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
            print("EVAL", json.dumps(rec), flush=True)
            tmp = ckpt_path.with_suffix(".tmp")
            torch.save(dict(model=model.state_dict(), opt=opt.state_dict(), step=step,
                            elapsed=elapsed_before + time.time() - t0, tokens=tokens_seen,
                            config=kt.config_dict(cfg), seed=args.seed), tmp)
            os.replace(tmp, ckpt_path)
        if done:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
