"""kvlab-tiny: a small Llama whose retrieval circuit is wired by hand, and its PyTorch forward.

Why wired: on this project's 2-core CPU, training never made copying emerge (see
data/README.md). So the copying mechanism is written into the weights at initialisation and
kept frozen, and language modelling is trained around it.

Architecture (plain Llama: RoPE rotate-half as in Hugging Face, RMSNorm, SwiGLU, GQA):
  vocab 2048, dim 256, 5 layers, 2 query heads / 1 KV head, head_dim 128, FFN 384,
  rope_theta 1e16 (so RoPE pairs 16..63 turn by < 0.41 rad over 4096 positions and can carry
  content; pairs 0..5 carry position for the previous-token heads).

Residual stream layout (dims):                                       written by
  E  [0, 23)     code of the current token (unit code * kCodeScale)   embedding (frozen)
  P1 [23, 46)    code of token t-1                                    layer 0, head 0
  P2 [46, 69)    code of token t-2                                    layer 0, head 1
  P3 [69, 92)    code of token t-3                                    layer 1, head 0
  P4 [92, 115)   code of token t-4                                    layer 1, head 1
  O  [115, 138)  code of the token the induction head copies          layer 2, head 0
  138            constant kCodeScale (every token)                    embedding (frozen)
  139            BOS flag (kCodeScale on BOS only)                    embedding (frozen)
  [140, 256)     learned features                                     embedding, layers 2-4

Token codes (23 dims): the ten digits and the lone "▁" get exact one-hot codes (dims 0..10), so
digit copying never confuses digits; every other token gets a random unit code in dims 11..22.

Circuit:
  layers 0, 1  previous-token heads: q, k read the constant dim; RoPE pairs 0..5 make the score
               beta0 * sum_i cos((t - j - m) theta_i) peak at offset m (m = 1, 2), 0.69*beta0
               above every other offset up to 4096. Values copy the E (layer 0) or P2 (layer 1)
               code into P1, P2 (layer 0) or P3, P4 (layer 1). Their FFNs are zero.
  layer 2 head 0  4-gram induction head: q = beta * [E, P1, P2, P3](t), k = [P1, P2, P3, P4](j)
               in RoPE pairs 16..63, score = beta * #{m : tok(t-m) == tok(j-1-m)} (exact for
               digits, approximate for words); a BOS "sink" key scores beta * kSinkScore, so the
               head copies only when all four tokens match, else it rests on BOS (value 0). The
               value is code(tok j) -> O. lm_head reads O (trained, initialised to gain kCopyGain).
Everything else (embedding learned dims, layer-2 head 1 query and output, FFN 2-4, layers 3-4,
final norm, lm_head) is trained. Frozen entries are enforced by gradient masks.
"""
import math
from dataclasses import dataclass, asdict

import numpy as np
import torch
import torch.nn.functional as F


@dataclass
class Config:
    vocab_size: int = 2048
    dim: int = 256
    n_layers: int = 5
    n_heads: int = 2
    n_kv_heads: int = 1
    head_dim: int = 128
    hidden_dim: int = 384
    rope_theta: float = 1e16
    rms_eps: float = 1e-5
    max_seq_len: int = 4096


# ---- residual layout ------------------------------------------------------------------------
kCodeDims = 23
kDigitDims = 11
SLOT_E, SLOT_P1, SLOT_P2, SLOT_P3, SLOT_P4, SLOT_O = (i * kCodeDims for i in range(6))
DIM_CONST = 6 * kCodeDims        # 138
DIM_BOS = DIM_CONST + 1          # 139
LEARNED_BEGIN = DIM_BOS + 1      # 140
kCodeScale = 8.0
kPrevBeta = 30.0        # previous-token head sharpness (score gap 0.686 * 30 ~ 20.6)
kPrevPairs = 6          # RoPE pairs used by the previous-token heads
kContentPairBegin = 16  # RoPE pairs 16..63 carry content in the induction head
kInductionBeta = 12.0   # induction sharpness per matched token
kSinkScore = 3.4        # BOS scores like 3.4 matched tokens
kCopyGain = 20.0        # initial logit gain of the copied token
kLearnedEmbMaxNorm = 3.0


def slot(start):
    return slice(start, start + kCodeDims)


def rope_thetas(cfg: Config) -> np.ndarray:
    """theta_i = base^(-2i/head_dim), i = 0 .. head_dim/2 - 1 (float64)."""
    return cfg.rope_theta ** (-np.arange(cfg.head_dim // 2, dtype=np.float64) * 2.0 / cfg.head_dim)


def token_codes(pieces, seed=1234) -> np.ndarray:
    """[vocab, kCodeDims] unit codes: one-hot for '0'..'9' and '▁', random elsewhere; BOS row 0."""
    rng = np.random.default_rng(seed)
    codes = np.zeros((len(pieces), kCodeDims))
    special = [str(d) for d in range(10)] + ["\u2581"]
    for i, p in enumerate(pieces):
        if p in special:
            codes[i, special.index(p)] = 1.0
        else:
            c = rng.standard_normal(kCodeDims - kDigitDims)
            codes[i, kDigitDims:] = c / np.linalg.norm(c)
    return codes


class TinyLlama(torch.nn.Module):
    """Weights stored as in Hugging Face Llama (rotate-half RoPE), row-major [out, in]."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        D, H, KV, hd, FF, V = cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.hidden_dim, cfg.vocab_size
        P = torch.nn.Parameter
        self.tok_embeddings = P(torch.zeros(V, D))                # [vocab, dim]
        self.layers = torch.nn.ModuleList()
        for _ in range(cfg.n_layers):
            layer = torch.nn.Module()
            layer.attn_norm = P(torch.ones(D))                    # [dim]
            layer.wq = P(torch.zeros(H * hd, D))                  # [heads*hd, dim]
            layer.wk = P(torch.zeros(KV * hd, D))                 # [kv*hd, dim]
            layer.wv = P(torch.zeros(KV * hd, D))                 # [kv*hd, dim]
            layer.wo = P(torch.zeros(D, H * hd))                  # [dim, heads*hd]
            layer.ffn_norm = P(torch.ones(D))                     # [dim]
            layer.w_gate = P(torch.zeros(FF, D))                  # [hidden, dim]
            layer.w_up = P(torch.zeros(FF, D))                    # [hidden, dim]
            layer.w_down = P(torch.zeros(D, FF))                  # [dim, hidden]
            self.layers.append(layer)
        self.final_norm = P(torch.ones(D))                        # [dim]
        self.lm_head = P(torch.zeros(V, D))                       # [vocab, dim]
        self._rope_cache = {}
        # Layers whose weights are all frozen and whose FFN is zero (the previous-token layers).
        self.n_frozen_layers = 2

    def rope(self, T: int, device=None):
        if T not in self._rope_cache:
            th = torch.tensor(rope_thetas(self.cfg), dtype=torch.float64)
            ang = torch.arange(T, dtype=torch.float64)[:, None] * th[None, :]   # [T, hd/2]
            self._rope_cache = {T: (torch.cos(ang).float(), torch.sin(ang).float())}
        return self._rope_cache[T]

    def rms(self, x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.rms_eps) * g

    @staticmethod
    def apply_rope(x, cos, sin):
        """x: [B, h, T, hd]; rotate-half: pairs (i, i + hd/2) turn by pos * theta_i."""
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def forward(self, tokens, return_layer_inputs=False):
        """tokens [B, T] int64 -> logits [B, T, vocab] (positions 0..T-1, causal)."""
        cfg = self.cfg
        B, T = tokens.shape
        H, KV, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        cos, sin = self.rope(T)
        mask = torch.full((T, T), float("-inf")).triu(1)
        x = self.tok_embeddings[tokens]
        inputs = []
        for li, layer in enumerate(self.layers):
            inputs.append(x)
            if li < self.n_frozen_layers and torch.is_grad_enabled():
                # Wired layers: their weights are frozen and their FFNs are zero, so only the
                # residual path carries gradient (to the embedding); skip their backward.
                with torch.no_grad():
                    delta = self.attention(layer, x, cos, sin, mask)
                x = x + delta
                continue
            x = x + self.attention(layer, x, cos, sin, mask)
            h = self.rms(x, layer.ffn_norm)
            x = x + (F.silu(h @ layer.w_gate.t()) * (h @ layer.w_up.t())) @ layer.w_down.t()
        logits = self.rms(x, self.final_norm) @ self.lm_head.t()
        return (logits, inputs) if return_layer_inputs else logits

    def attention(self, layer, x, cos, sin, mask):
        """x [B, T, dim] -> attention block output [B, T, dim] (before the residual add)."""
        cfg = self.cfg
        B, T, _ = x.shape
        H, KV, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        h = self.rms(x, layer.attn_norm)
        q = (h @ layer.wq.t()).view(B, T, H, hd).transpose(1, 2)
        k = (h @ layer.wk.t()).view(B, T, KV, hd).transpose(1, 2)
        v = (h @ layer.wv.t()).view(B, T, KV, hd).transpose(1, 2)
        q, k = self.apply_rope(q, cos, sin), self.apply_rope(k, cos, sin)
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hd)) + mask
        o = torch.softmax(att, dim=-1) @ v                    # [B, H, T, hd]
        return o.transpose(1, 2).reshape(B, T, H * hd) @ layer.wo.t()


def nominal_rms(n_code_slots: int, dim: int) -> float:
    """RMS of a residual holding n_code_slots codes of norm kCodeScale plus the constant dim."""
    return math.sqrt((n_code_slots + 1) * kCodeScale ** 2 / dim)


@torch.no_grad()
def wire(model: TinyLlama, pieces, seed=0):
    """Writes the circuit into model (see module doc) and initialises the learned part.
    Returns {param name: float mask} with 1 where training may change the entry."""
    cfg = model.cfg
    D, hd, V = cfg.dim, cfg.head_dim, cfg.vocab_size
    half = hd // 2
    gen = torch.Generator().manual_seed(seed)
    codes = torch.tensor(token_codes(pieces), dtype=torch.float32)     # [vocab, 23]
    th = rope_thetas(cfg)
    masks = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    L = slice(LEARNED_BEGIN, D)
    n_learned = D - LEARNED_BEGIN
    s = kCodeScale

    def randn(*shape, std):
        return torch.randn(*shape, generator=gen) * std

    # Embedding: E = s * code, const = s, BOS flag; learned dims small random (trainable).
    emb = model.tok_embeddings
    emb[:, slot(SLOT_E)] = s * codes
    emb[:, DIM_CONST] = s
    bos = 1
    emb[bos, slot(SLOT_E)] = 0.0
    emb[bos, DIM_BOS] = s
    emb[:, L] = randn(V, n_learned, std=0.25)
    masks["tok_embeddings"][:, L] = 1

    def prev_token_layer(li, v_src, dst0, dst1, n_slots):
        """Heads 0/1 attend to offsets 1/2 and copy slot v_src into dst0/dst1."""
        layer = model.layers[li]
        r = nominal_rms(n_slots, D)
        const_hat = s / r                      # normalised value of the constant dim
        for i in range(kPrevPairs):
            # BOS carries no codes, so deeper in the stack its RMS is smaller and its normalised
            # constant larger than other tokens' (x1.41 in layer 1); its flag halves its key so
            # it can never outscore the offset-m peak (BOS key <= 0.71 of a normal key).
            layer.wk[i, DIM_CONST] = 1.0 / const_hat
            layer.wk[i, DIM_BOS] = -0.5 / const_hat
            for head, m in ((0, 1), (1, 2)):
                scale = kPrevBeta * math.sqrt(hd) / const_hat
                layer.wq[head * hd + i, DIM_CONST] = scale * math.cos(m * th[i])
                layer.wq[head * hd + i + half, DIM_CONST] = -scale * math.sin(m * th[i])
        for d in range(kCodeDims):
            layer.wv[d, v_src + d] = r / s     # value = unit code
            layer.wo[dst0 + d, d] = s
            layer.wo[dst1 + d, hd + d] = s

    prev_token_layer(0, SLOT_E, SLOT_P1, SLOT_P2, n_slots=1)
    prev_token_layer(1, SLOT_P2, SLOT_P3, SLOT_P4, n_slots=3)

    # Layer 2, head 0: 4-gram induction head with a BOS sink.
    layer = model.layers[2]
    r2 = nominal_rms(5, D)
    r_bos = nominal_rms(1, D)                  # BOS: constant + flag
    content = [i for i in range(kContentPairBegin, half)] + [i + half for i in range(kContentPairBegin, half)]
    sink_dim = half - 1
    content.remove(sink_dim)
    q_src = [SLOT_E, SLOT_P1, SLOT_P2, SLOT_P3]
    k_src = [SLOT_P1, SLOT_P2, SLOT_P3, SLOT_P4]
    for m in range(4):
        dims = content[m * kCodeDims:(m + 1) * kCodeDims]
        for d, hdim in enumerate(dims):
            layer.wq[hdim, q_src[m] + d] = kInductionBeta * math.sqrt(hd) * r2 / s
            layer.wk[hdim, k_src[m] + d] = r2 / s
    layer.wk[sink_dim, DIM_BOS] = r_bos / s
    layer.wq[sink_dim, DIM_CONST] = kInductionBeta * kSinkScore * math.sqrt(hd) * r2 / s
    for d in range(kCodeDims):
        layer.wv[d, SLOT_E + d] = r2 / s
        layer.wo[SLOT_O + d, d] = s
    # head 1 of layer 2: learned query and output (shares the wired K/V).
    layer.wq[hd:2 * hd, L] = randn(hd, n_learned, std=0.02)
    masks["layers.2.wq"][hd:2 * hd, :] = 1
    masks["layers.2.wo"][:, hd:2 * hd] = 1

    # Learned FFNs in layers 2..4, learned attention in layers 3..4.
    out_std = 0.02 / math.sqrt(2 * cfg.n_layers)
    for li in range(2, cfg.n_layers):
        layer = model.layers[li]
        layer.w_gate.copy_(randn(*layer.w_gate.shape, std=0.02))
        layer.w_up.copy_(randn(*layer.w_up.shape, std=0.02))
        layer.w_down.copy_(randn(*layer.w_down.shape, std=out_std))
        for n in ("ffn_norm", "w_gate", "w_up", "w_down"):
            masks[f"layers.{li}.{n}"][...] = 1
        if li >= 3:
            layer.wq.copy_(randn(*layer.wq.shape, std=0.02))
            layer.wk.copy_(randn(*layer.wk.shape, std=0.02))
            layer.wv.copy_(randn(*layer.wv.shape, std=0.02))
            layer.wo.copy_(randn(*layer.wo.shape, std=out_std))
            for n in ("attn_norm", "wq", "wk", "wv", "wo"):
                masks[f"layers.{li}.{n}"][...] = 1

    # lm_head: O slot reads the copied code with gain kCopyGain; learned dims random.
    r_final = nominal_rms(6, D)
    model.lm_head[:, slot(SLOT_O)] = kCopyGain * codes * r_final / s
    model.lm_head[:, L] = randn(V, n_learned, std=0.02)
    masks["lm_head"][...] = 1
    masks["final_norm"][...] = 1
    return masks


def fit_bigram(train_ids: np.ndarray, cfg: Config, steps=150, lr=0.05, seed=0, log=None):
    """Data-derived start for the language-modelling path: a rank-(learned dims) bigram model
    logits(a -> .) = E[a] @ W^T + b fitted by full-batch Adam on the training split's bigram
    counts (every training bigram, each step), with |E[a]| <= kLearnedEmbMaxNorm.
    Returns (E [vocab, n_learned], W [vocab, n_learned], b [vocab]) as float32 tensors."""
    V, n = cfg.vocab_size, cfg.dim - LEARNED_BEGIN
    counts = np.zeros((V, V), dtype=np.float32)
    np.add.at(counts, (train_ids[:-1], train_ids[1:]), 1.0)
    C = torch.tensor(counts)
    total = C.sum()
    uni = torch.tensor(np.bincount(train_ids, minlength=V) + 1.0, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    E = (torch.randn(V, n, generator=gen) * 0.1).requires_grad_()
    W = (torch.randn(V, n, generator=gen) * 0.1).requires_grad_()
    b = torch.log(uni / uni.sum()).requires_grad_()
    opt = torch.optim.Adam([E, W, b], lr=lr)
    for step in range(steps):
        logits = E @ W.t() + b
        loss = -(C * torch.log_softmax(logits, dim=-1)).sum() / total
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            E.mul_(kLearnedEmbMaxNorm / E.norm(dim=1, keepdim=True).clamp(min=kLearnedEmbMaxNorm))
        if log and (step % 25 == 0 or step == steps - 1):
            log(f"bigram fit step {step} train NLL {loss.item():.3f} (PPL {math.exp(loss.item()):.1f})")
    return E.detach(), W.detach(), b.detach()


@torch.no_grad()
def apply_bigram_init(model: TinyLlama, E, W, b):
    """Puts the fitted bigram into the learned embedding dims, the output head's learned
    columns and its constant column (the unigram-like bias), scaled for the final RMSNorm
    (nominal RMS with no copied code; final norm gain 1)."""
    r_final = nominal_rms(5, model.cfg.dim)
    model.tok_embeddings[:, LEARNED_BEGIN:] = E
    model.lm_head[:, LEARNED_BEGIN:] = W * r_final
    model.lm_head[:, DIM_CONST] = b * r_final / kCodeScale


@torch.no_grad()
def clamp_learned_embeddings(model: TinyLlama):
    """Keeps each token's learned embedding part at norm <= kLearnedEmbMaxNorm so the wired
    layers' RMS normalisation (dominated by the fixed code slots) stays within ~2% of nominal."""
    e = model.tok_embeddings[:, LEARNED_BEGIN:]
    n = e.norm(dim=1, keepdim=True).clamp(min=kLearnedEmbMaxNorm)
    e.mul_(kLearnedEmbMaxNorm / n)


def state_numpy(model: TinyLlama):
    return {n: p.detach().cpu().numpy().astype(np.float32) for n, p in model.named_parameters()}


def config_dict(cfg: Config):
    return asdict(cfg)
