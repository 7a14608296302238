#!/usr/bin/env python3
"""PyTorch scaled_dot_product_attention (flash backend) on the prefill benchmark's shapes.

The reference the issue's prefill target is measured against: one causal sequence of --seq
tokens, --heads query heads over --kv-heads KV heads (K/V repeated to the query heads: the flash
kernel does the same work per head), head dim 64 and 128, bf16. Writes one CSV row per case with
the same columns as kvlab_cuda_bench. Needs torch with CUDA; prints why and exits 0 without it.

usage: bench_sdpa.py [--csv PATH] [--seq 16384] [--heads 32] [--kv-heads 8] [--iters 10]
"""
import argparse
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default="")
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"bench_sdpa: torch unavailable ({e}); nothing to measure")
        return 0
    if not torch.cuda.is_available():
        print("bench_sdpa: torch sees no CUDA device; nothing to measure")
        return 0
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    except ImportError:  # older torch
        backend = torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False,
                                                 enable_mem_efficient=False)
    header = ("bench,case,dtype,batch,ctx,num_qo_heads,num_kv_heads,head_dim,page_size,"
              "selected_frac,key_mass,splits,time_ms,bytes,tb_per_s,tflop_per_s")
    rows = []
    L, H = args.seq, args.heads
    for d in (128, 64):
        q = torch.randn(1, H, L, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, args.kv_heads, L, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        rep = H // args.kv_heads
        k = k.repeat_interleave(rep, dim=1).contiguous()
        v = v.repeat_interleave(rep, dim=1).contiguous()
        with backend:
            for _ in range(2):
                F.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.cuda.synchronize()
            times = []
            for _ in range(args.iters):
                start = torch.cuda.Event(enable_timing=True)
                stop = torch.cuda.Event(enable_timing=True)
                start.record()
                F.scaled_dot_product_attention(q, k, v, is_causal=True)
                stop.record()
                stop.synchronize()
                times.append(start.elapsed_time(stop))
        times.sort()
        ms = times[len(times) // 2]
        flops = 4.0 * H * d * (L * (L + 1) / 2)
        row = (f"sdpa_flash,causal,bf16,1,{L},{H},{args.kv_heads},{d},0,1.0000,0,1,{ms:.4f},0,0.000,"
               f"{flops / (ms * 1e-3) / 1e12:.2f}")
        print(row)
        rows.append(row)
    if args.csv:
        with open(args.csv, "w") as f:
            f.write(header + "\n")
            for r in rows:
                f.write(r + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
