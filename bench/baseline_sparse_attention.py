#!/usr/bin/env python3
"""Plain-PyTorch baseline of bench_sparse_attention: what a user writes without a kernel.

Same cases and names as bench/bench_sparse_attention.cu: pools of 262,144 random 584-byte entries,
random slots (or, for the "_local" prefill cases, a request's chunk after a 64K-token prefix: each
row's 128-token window and K sorted entries of its visible compressed ones), 128 window + K
compressed candidates per row. Per call: gather the entries' bytes,
dequantize (e4m3 · 2^(scale−127), bf16 RoPE part), einsum for the scores, softmax with the sink as
an extra column, einsum for the output. Median of CUDA-event timings, L2 flushed before each.
Writes <results>/baseline_sparse_attention.json: [{"name", "baseline_us"}].
"""
import json
import os
import sys

import torch

from torch_timing import time_us

PER_PAGE = 64
POOL_PAGES = 4096
DATA = 576  # 448 e4m3 + 64 bf16 per entry
PAGE_BYTES = ((PER_PAGE * 584 + 575) // 576) * 576
LOCAL_PREFIX = 65536


def random_pool(generator):
    pages = torch.randint(0, 256, (POOL_PAGES, PAGE_BYTES), dtype=torch.uint8, device="cuda", generator=generator)
    data = pages[:, : PER_PAGE * DATA].view(POOL_PAGES, PER_PAGE, DATA)
    codes = data[..., :448]
    codes[(codes & 0x7F) == 0x7F] -= 1  # no NaN codes
    rope = torch.empty(POOL_PAGES, PER_PAGE, 64, device="cuda").uniform_(-2, 2, generator=generator)
    data[..., 448:] = rope.to(torch.bfloat16).view(torch.uint8).view(POOL_PAGES, PER_PAGE, 128)
    scales = pages[:, PER_PAGE * DATA : PER_PAGE * 584].view(POOL_PAGES, PER_PAGE, 8)
    scales[..., :7] = torch.randint(118, 126, (POOL_PAGES, PER_PAGE, 7), dtype=torch.uint8, device="cuda",
                                    generator=generator)
    scales[..., 7] = 0
    return pages


def gather_entries(pages, slots):
    """slots [R, n] int64 → decoded entries [R, n, 512] bf16."""
    data = pages.as_strided((POOL_PAGES, PER_PAGE, DATA), (PAGE_BYTES, DATA, 1))
    scales = pages.as_strided((POOL_PAGES, PER_PAGE, 8), (PAGE_BYTES, 8, 1), PER_PAGE * DATA)
    page, index = slots // PER_PAGE, slots % PER_PAGE
    raw = data[page, index]  # [R, n, 576]
    scale = torch.exp2(scales[page, index][..., :7].float() - 127)  # [R, n, 7]
    nope = raw[..., :448].view(torch.float8_e4m3fn).float().unflatten(-1, (7, 64)) * scale.unsqueeze(-1)
    rope = raw[..., 448:].contiguous().view(torch.bfloat16)
    return torch.cat([nope.flatten(-2).to(torch.bfloat16), rope], dim=-1)


def attention(q, window_pool, compressed_pool, window_slots, compressed_slots, sink):
    entries = torch.cat([gather_entries(window_pool, window_slots), gather_entries(compressed_pool, compressed_slots)], 1)
    scores = torch.einsum("rhd,rnd->rhn", q, entries).float() * (512 ** -0.5)
    scores = torch.cat([scores, sink.view(1, -1, 1).expand(q.shape[0], -1, 1)], dim=-1)
    probs = torch.softmax(scores, dim=-1)[..., :-1]
    return torch.einsum("rhn,rnd->rhd", probs.to(torch.bfloat16), entries)


def local_prefill_slots(rows, k, generator):
    """Row r = token LOCAL_PREFIX + r of one request: its window's consecutive slots, and k distinct
    entries of its visible compressed ones ((position + 1) // 4 of them), ascending."""
    slots = POOL_PAGES * PER_PAGE
    position = LOCAL_PREFIX + torch.arange(rows, device="cuda")
    window = (position.view(-1, 1) - 127 + torch.arange(128, device="cuda")) % slots
    visible = torch.clamp((position + 1) // 4, max=slots)
    limit = int(visible.max())
    if int(visible.min()) < k:
        raise ValueError(f"{int(visible.min())} visible compressed entries, fewer than K = {k}")
    keys = torch.rand(rows, limit, device="cuda", generator=generator)
    keys[torch.arange(limit, device="cuda").view(1, -1) >= visible.view(-1, 1)] = 2.0  # never drawn
    compressed = keys.topk(k, dim=1, largest=False).indices.sort(dim=1).values
    return window, compressed


def cases():
    for heads in (64, 128):
        for k in (512, 1024, 2048):
            for next_n in (1, 2):
                for batch in (1, 32, 128):
                    yield f"decode_B{batch}_H{heads}_N{128 + k}_nn{next_n}", batch * next_n, heads, k
    for heads in (64, 128):
        for k in (512, 1024):
            yield f"prefill_T4096_H{heads}_N{128 + k}", 4096, heads, k
            yield f"prefill_T4096_H{heads}_N{128 + k}_local", 4096, heads, k


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out_dir, exist_ok=True)
    generator = torch.Generator(device="cuda").manual_seed(20261129)
    window_pool, compressed_pool = random_pool(generator), random_pool(generator)
    records = []
    for name, rows, heads, k in cases():
        q = (torch.rand(rows, heads, 512, device="cuda", generator=generator) * 4 - 2).to(torch.bfloat16)
        slots = POOL_PAGES * PER_PAGE
        if name.endswith("_local"):
            window_slots, compressed_slots = local_prefill_slots(rows, k, generator)
        else:
            window_slots = torch.randint(0, slots, (rows, 128), device="cuda", generator=generator)
            compressed_slots = torch.randint(0, slots, (rows, k), device="cuda", generator=generator)
        sink = torch.rand(heads, device="cuda", generator=generator) * 3 - 1
        with torch.no_grad():
            us = time_us(lambda: attention(q, window_pool, compressed_pool, window_slots, compressed_slots, sink),
                         warmup=3, repeats=5 if rows >= 4096 else 10)
        records.append({"name": name, "baseline_us": us})
        print(f"{name:40s} {us:10.1f} us", flush=True)
        del q, window_slots, compressed_slots
        torch.cuda.empty_cache()
    with open(os.path.join(out_dir, "baseline_sparse_attention.json"), "w") as f:
        json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
