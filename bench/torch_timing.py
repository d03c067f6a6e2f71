"""Timing shared by the PyTorch baselines (bench/baseline_*.py): the same method as bench_common.hpp.

Median of CUDA-event timings after warm-up, the L2 flushed (a 256 MB write) before each timed call.
"""
import torch

_flush = None


def time_us(fn, warmup=3, repeats=20):
    """Median time of fn() in microseconds."""
    global _flush
    if _flush is None:
        _flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        _flush.zero_()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) * 1000.0)
    samples.sort()
    return samples[len(samples) // 2]
