#!/usr/bin/env python3
"""Plain-PyTorch baseline of bench_compressor: the compressor as a user writes it without a kernel.

Same cases and names as bench/bench_compressor.cu.
Prefill: unfold the [T, coff·c] float32 rows into blocks, build the candidates (with overlap: the b
half of block n−1, −inf for n = 0, then the a half of block n), add ape, softmax over the candidates,
weighted sum. Online C128 prefill is the same formula. Only the pooling is timed: RMSNorm, RoPE,
FP8 encoding and the paged store, which the CUDA kernel also does, are left out, so the speed-ups
reported against this baseline are lower bounds.
Chunk (T rows on a prefix of P): two-pass, the prefix's rows still needed (from the block before the
open one, with overlap) gathered from the ring and pooled with the new rows, then the ring's last R
rows written; online, the open block finished from its (max, sum, mean) state in one vectorized
merge, the whole blocks pooled, the state of the block left open computed.
Decode: B requests with a float32 ring state [B, R, 2·coff·c] (two-pass) or an online state
[B, 3, c]: write the new rows into the ring, gather every request's current window from it,
softmax and sum (two-pass); or run the online recurrence over the new rows (online).
Median of CUDA-event timings, L2 flushed before each. Writes <results>/baseline_compressor.json.
Usage: baseline_compressor.py RESULTS_DIR [FILTER,...]: with filters, only the cases whose name
contains one of them (a short device run can then re-measure the cases it needs).
"""
import json
import os
import sys

import torch

from torch_timing import time_us

KINDS = [  # name, ratio, overlap, width, online
    ("C4-512", 4, True, 512, False),
    ("C4-128", 4, True, 128, False),
    ("C128", 128, False, 512, False),
    ("C128-online", 128, False, 512, True),
]
MAX_ROLLBACK = 8


def pool_blocks(kv, score, ape, ratio, overlap, width):
    """kv, score [T, coff·c] → compressed rows [T // m, c] (ape None: already in the scores)."""
    blocks = kv.shape[0] // ratio
    v = kv[: blocks * ratio].view(blocks, ratio, -1)
    s = score[: blocks * ratio].view(blocks, ratio, -1)
    if ape is not None:
        s = s + ape
    if overlap:
        s_b = torch.cat([torch.full_like(s[:1, :, :width], float("-inf")), s[:-1, :, :width]], 0)
        v_b = torch.cat([torch.zeros_like(v[:1, :, :width]), v[:-1, :, :width]], 0)
        s = torch.cat([s_b, s[:, :, width:]], 1)
        v = torch.cat([v_b, v[:, :, width:]], 1)
    return (torch.softmax(s, dim=1) * v).sum(1)


def prefill_case(kind, tokens):
    _, ratio, overlap, width, _ = kind
    row = (2 if overlap else 1) * width
    kv = torch.rand(tokens, row, device="cuda") * 4 - 2
    score = torch.rand(tokens, row, device="cuda") * 8 - 4
    ape = torch.rand(ratio, row, device="cuda") * 2 - 1
    return time_us(lambda: pool_blocks(kv, score, ape, ratio, overlap, width))


def chunk_case(kind, prefix, tokens):
    _, ratio, overlap, width, online = kind
    coff = 2 if overlap else 1
    row = coff * width
    kv = torch.rand(tokens, row, device="cuda") * 4 - 2
    score = torch.rand(tokens, row, device="cuda") * 8 - 4
    ape = torch.rand(ratio, row, device="cuda") * 2 - 1
    end = prefix + tokens
    new_ape = ape[(prefix + torch.arange(tokens, device="cuda")) % ratio]
    if online:
        state = torch.rand(3, width, device="cuda") + 0.5  # M, S, V of the open block
        head = (-prefix) % ratio  # new rows that finish the open block
        body_end = head + (tokens - head) // ratio * ratio

        def step():
            out = []
            if head:
                m, s, v = state[0], state[1], state[2]
                sc = score[:head] + new_ape[:head]
                new_m = torch.maximum(m, sc.max(0).values)
                w, old = torch.exp(sc - new_m), s * torch.exp(m - new_m)
                total = old + w.sum(0)
                out.append(((v * old + (kv[:head] * w).sum(0)) / total).unsqueeze(0))
            out.append(pool_blocks(kv[head:body_end], score[head:body_end], ape, ratio, False, width))
            if body_end < tokens:  # the block left open: its state
                sc = score[body_end:] + new_ape[body_end:]
                m = sc.max(0).values
                w = torch.exp(sc - m)
                state.copy_(torch.stack([m, w.sum(0), (kv[body_end:] * w).sum(0) / w.sum(0)]))
            return torch.cat(out)
        return time_us(step)

    ring_rows = coff * ratio + MAX_ROLLBACK
    ring = torch.rand(ring_rows, 2 * row, device="cuda") * 4 - 2
    start = prefix // ratio * ratio - (ratio if overlap and prefix >= ratio else 0)
    old_slots = torch.arange(start, prefix, device="cuda") % ring_rows
    pooled = end // ratio * ratio - start
    kept = max(prefix, end - ring_rows)
    kept_slots = torch.arange(kept, end, device="cuda") % ring_rows

    def step():
        old = ring[old_slots]
        v = torch.cat([old[:, :row], kv])
        s = torch.cat([old[:, row:], score + new_ape])
        out = pool_blocks(v[:pooled], s[:pooled], None, ratio, overlap, width)
        ring[kept_slots] = torch.cat([kv[kept - prefix:], s[kept - start:]], 1)
        return out[1:] if overlap and start < prefix // ratio * ratio else out
    return time_us(step)


def decode_case(kind, requests, new_tokens, generator):
    _, ratio, overlap, width, online = kind
    coff = 2 if overlap else 1
    row = coff * width
    prefix = ratio * torch.randint(8, 201, (requests,), device="cuda", generator=generator) + torch.randint(
        0, ratio, (requests,), device="cuda", generator=generator)
    kv = torch.rand(requests, new_tokens, row, device="cuda") * 4 - 2
    score = torch.rand(requests, new_tokens, row, device="cuda") * 8 - 4
    ape = torch.rand(ratio, row, device="cuda") * 2 - 1
    positions = prefix.unsqueeze(1) + torch.arange(new_tokens, device="cuda")  # [B, n]
    if online:
        state = torch.rand(requests, 3, width, device="cuda") + 0.5  # M, S, V

        def step():
            m, s, v = state[:, 0], state[:, 1], state[:, 2]
            out = []
            for t in range(new_tokens):
                sc = score[:, t] + ape[positions[:, t] % ratio]
                first = (positions[:, t] % ratio == 0).unsqueeze(1)
                new_m = torch.maximum(m, sc)
                old_w, new_w = torch.exp(m - new_m), torch.exp(sc - new_m)
                new_s = s * old_w + new_w
                new_v = (v * s * old_w + kv[:, t] * new_w) / new_s
                m, s, v = torch.where(first, sc, new_m), torch.where(first, 1.0, new_s), torch.where(first, kv[:, t], new_v)
                out.append(torch.where(((positions[:, t] + 1) % ratio == 0).unsqueeze(1), v, 0.0))
            state.copy_(torch.stack([m, s, v], 1))
            return torch.stack(out, 1)
        return time_us(step)

    ring_rows = coff * ratio + MAX_ROLLBACK
    ring = torch.rand(requests, ring_rows, 2 * row, device="cuda") * 4 - 2
    batch = torch.arange(requests, device="cuda")
    # The window of the last block each request's new rows complete (or touch).
    last = positions[:, -1]
    entry = (last + 1) // ratio - 1
    first = (entry - (1 if overlap else 0)).clamp(min=0) * ratio
    window = first.unsqueeze(1) + torch.arange(coff * ratio, device="cuda")  # [B, coff·m]

    def step():
        ring[batch.unsqueeze(1), positions % ring_rows, :row] = kv
        ring[batch.unsqueeze(1), positions % ring_rows, row:] = score + ape[positions % ratio]
        rows = ring[batch.unsqueeze(1), window % ring_rows]  # [B, coff·m, 2·row]
        if overlap:
            v = torch.cat([rows[:, :ratio, :width], rows[:, ratio:, width:row]], 1)
            s = torch.cat([rows[:, :ratio, row:row + width], rows[:, ratio:, row + width:]], 1)
        else:
            v, s = rows[:, :, :row], rows[:, :, row:]
        return (torch.softmax(s, dim=1) * v).sum(1)
    return time_us(step)


def main():
    results = sys.argv[1] if len(sys.argv) > 1 else "."
    filters = sys.argv[2].split(",") if len(sys.argv) > 2 else [""]
    wanted = lambda name: any(f in name for f in filters)
    os.makedirs(results, exist_ok=True)
    records = []
    generator = torch.Generator(device="cuda")
    generator.manual_seed(5)
    for kind in KINDS:
        for tokens in (8192, 65536, 262144):
            name = f"prefill {kind[0]} T={tokens}"
            if not wanted(name):
                continue
            records.append({"name": name, "baseline_us": prefill_case(kind, tokens)})
            print(f"{name:40s} {records[-1]['baseline_us']:10.1f} us", flush=True)
    for kind in KINDS:
        for prefix in (65536, 65538):
            name = f"prefill chunk {kind[0]} P={prefix} T=8192"
            if not wanted(name):
                continue
            records.append({"name": name, "baseline_us": chunk_case(kind, prefix, 8192)})
            print(f"{name:40s} {records[-1]['baseline_us']:10.1f} us", flush=True)
    for kind in KINDS:
        for new_tokens in (1, 4, 8):
            for requests in (1, 8, 64, 256, 1024) if new_tokens < 8 else (1, 256):
                name = f"decode {kind[0]} B={requests} n={new_tokens}"
                if not wanted(name):
                    continue
                records.append({"name": name, "baseline_us": decode_case(kind, requests, new_tokens, generator)})
                print(f"{name:40s} {records[-1]['baseline_us']:10.1f} us", flush=True)
    with open(os.path.join(results, "baseline_compressor.json"), "w") as f:
        json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
