#!/usr/bin/env python3
"""Plain-PyTorch baselines for the indexer benchmarks (bench_indexer, bench_topk), same shapes.

What a user writes without our kernels: keys dequantized to bf16, scores as a bf16 matmul + ReLU +
weighted head sum (+ the key scale), torch.topk for the selection, and the query preparation in
float32 ops. Writes <out_dir>/baseline_indexer.json: [{"name": <bench case>, "baseline_us": t}].
Usage: baseline_indexer.py <out_dir>
"""
import json
import os
import sys

import torch

from torch_timing import time_us

HEADS, DIM = 64, 128


def decode_scores(q, k, w, key_scale):
    """q [B, R, H, D] bf16, k [B, N, D] bf16, w [B, R, H] f32, key_scale [B, N] f32 → [B, R, N] f32."""
    b, r, h, d = q.shape
    logits = torch.matmul(q.view(b, r * h, d), k.transpose(1, 2)).view(b, r, h, -1).relu_()
    return (logits * w[..., None].to(logits.dtype)).sum(dim=2, dtype=torch.float32) * key_scale[:, None, :]


def prefill_scores(q, k, w, key_scale, chunk=4096):
    """Causal prefill: q [T, H, D], k [T/4, D]; rows in chunks so the logits fit in memory."""
    t_total, n = q.shape[0], k.shape[0]
    out = torch.empty(t_total, n, dtype=torch.float32, device=q.device)
    cols = torch.arange(n, device=q.device)
    for t0 in range(0, t_total, chunk):
        qc = q[t0:t0 + chunk]
        rows = qc.shape[0]
        logits = torch.matmul(qc.reshape(rows * HEADS, DIM), k.t()).view(rows, HEADS, n).relu_()
        s = (logits * w[t0:t0 + chunk, :, None].to(logits.dtype)).sum(dim=1, dtype=torch.float32) * key_scale
        visible = (torch.arange(t0, t0 + rows, device=q.device) + 1) // 4
        out[t0:t0 + rows] = s.masked_fill(cols[None, :] >= visible[:, None], float("-inf"))
    return out


def hadamard(n, device):
    h = torch.ones(1, 1, device=device)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n ** 0.5


E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def query_prep(q_rows, logits, cos, sin, h_matrix, fp8):
    """RoPE on the last 64 dims, Walsh–Hadamard, quantization like the keys, head weights."""
    rows = q_rows.shape[0]
    x = q_rows.view(rows, HEADS, DIM).clone()
    tail = x[..., DIM - 64:].view(rows, HEADS, 32, 2)
    a, b = tail[..., 0], tail[..., 1]
    c, s = cos[:, None, :], sin[:, None, :]
    x[..., DIM - 64:] = torch.stack([a * c - b * s, a * s + b * c], dim=-1).view(rows, HEADS, 64)
    y = x @ h_matrix
    if fp8:
        scale = y.abs().amax(dim=-1, keepdim=True).clamp_min(1e-4) / 448.0
        codes = (y / scale).to(torch.float8_e4m3fn)
        scales = scale.squeeze(-1)
    else:
        blocks = y.view(rows, HEADS, DIM // 32, 32)
        amax = blocks.abs().amax(dim=-1, keepdim=True).clamp_min(6 * 2.0 ** -126)
        scale = torch.exp2(torch.ceil(torch.log2(amax / 6.0)))
        v = blocks / scale
        grid = E2M1_GRID.to(v.device)
        mids = (grid[1:] + grid[:-1]) / 2
        codes = torch.bucketize(v.abs(), mids).to(torch.uint8) | (v < 0).to(torch.uint8) << 3
        codes = (codes[..., 0::2] | codes[..., 1::2] << 4)
        scales = scale.squeeze(-1)
    weights = logits * (DIM * HEADS) ** -0.5
    return codes, scales, weights


def main():
    out_dir = sys.argv[1]
    dev = "cuda"
    torch.manual_seed(0)
    records = []

    def add(names, us):
        for name in names:
            records.append({"name": name, "baseline_us": us})
        print(f"{names[0]:40s} {us:10.1f} us", flush=True)

    # Decode scores: the same torch computation stands for FP8 and FP4 keys (dequantized to bf16).
    for batch in (1, 32, 128):
        for n in (16384, 65536, 262144):
            k = torch.randn(batch, n, DIM, device=dev, dtype=torch.bfloat16)
            key_scale = torch.rand(batch, n, device=dev) * 0.01
            for next_n in (1, 2, 4):
                q = torch.randn(batch, next_n, HEADS, DIM, device=dev, dtype=torch.bfloat16)
                w = torch.randn(batch, next_n, HEADS, device=dev)
                us = time_us(lambda: decode_scores(q, k, w, key_scale), warmup=1, repeats=5)
                add([f"scores_{f}_b{batch}_n{n}_next{next_n}" for f in ("fp8", "fp4")], us)
                del q, w
            del k, key_scale
            torch.cuda.empty_cache()

    for t in (8192, 65536):
        n = t // 4
        q = torch.randn(t, HEADS, DIM, device=dev, dtype=torch.bfloat16)
        k = torch.randn(n, DIM, device=dev, dtype=torch.bfloat16)
        w = torch.randn(t, HEADS, device=dev)
        key_scale = torch.rand(n, device=dev) * 0.01
        us = time_us(lambda: prefill_scores(q, k, w, key_scale), warmup=1, repeats=3)
        add([f"prefill_{f}_t{t}" for f in ("fp8", "fp4")], us)
        del q, k, w, key_scale
        torch.cuda.empty_cache()

    h_matrix = hadamard(DIM, dev)
    for fp8, name in ((True, "fp8"), (False, "fp4")):
        for rows in (1, 128, 65536):
            q_rows = torch.randn(rows, HEADS * DIM, device=dev)
            logits = torch.randn(rows, HEADS, device=dev)
            cos, sin = torch.rand(rows, 32, device=dev), torch.rand(rows, 32, device=dev)
            us = time_us(lambda: query_prep(q_rows, logits, cos, sin, h_matrix, fp8), warmup=1, repeats=5)
            add([f"query_{name}_rows{rows}"], us)

    for batch, n, k in [(b, n, 512) for b in (1, 32, 128) for n in (16384, 65536, 262144)] + \
                       [(1, 262144, 1024), (128, 65536, 1024), (1, 262144, 2048), (128, 65536, 2048)]:
        scores = torch.randn(batch, n, device=dev)
        us = time_us(lambda: torch.topk(scores, k, dim=-1), warmup=1, repeats=10)
        add([f"topk_b{batch}_n{n}_k{k}"], us)

    with open(os.path.join(out_dir, "baseline_indexer.json"), "w") as f:
        json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
