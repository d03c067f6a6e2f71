#!/usr/bin/env python3
"""Summarizes an Nsight Compute source-page CSV (ncu -i REP --page source --csv --print-source X):
the instructions (or source lines) with the most warp-stall samples, and the stall reasons of each.
Usage: profile-source.py CSV [TOP]"""
import csv
import sys


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 60
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    header_at = next((i for i, r in enumerate(rows) if any("Sampling" in c for c in r)), None)
    if header_at is None:
        print("no sampling columns in", path)
        print("\n".join(",".join(r) for r in rows[:5]))
        return
    header, body = rows[header_at], rows[header_at + 1:]
    total_col = next(i for i, c in enumerate(header) if c.startswith("Warp Stall Sampling (All"))
    text_col = next((i for i, c in enumerate(header) if c in ("Source", "Sass", "SASS")), 1)
    reason_cols = [i for i, c in enumerate(header) if c.startswith("stall_") or "smsp__pcsamp" in c]
    total = sum(number(r[total_col]) for r in body if len(r) > total_col)
    print(f"{len(body)} lines, {total:.0f} warp-stall samples; columns: {', '.join(header[:12])} ...")
    ranked = sorted((r for r in body if len(r) > total_col), key=lambda r: -number(r[total_col]))
    # Totals per stall reason, then the samples of consecutive 64-instruction regions in address
    # order (a kernel's roles — e.g. producer and consumer warps — occupy separate regions).
    totals = {}
    for r in body:
        for i in reason_cols:
            if len(r) > i and "Not Issued" not in header[i]:
                name = header[i].replace("smsp__pcsamp_warps_issue_stalled_", "")
                totals[name] = totals.get(name, 0.0) + number(r[i])
    print("by reason: " + ", ".join(f"{k}={100 * v / max(total, 1):.1f}%" for k, v in
                                    sorted(totals.items(), key=lambda kv: -kv[1]) if v > 0))
    for start in range(0, len(body), 64):
        region = [r for r in body[start:start + 64] if len(r) > total_col]
        samples = sum(number(r[total_col]) for r in region)
        if samples < 0.005 * total:
            continue
        ops = {}
        for r in region:
            op = r[text_col].split()[0] if r[text_col].split() else "?"
            if op.startswith("@"):
                op = r[text_col].split()[1] if len(r[text_col].split()) > 1 else op
            op = op.split(".")[0]
            ops[op] = ops.get(op, 0) + 1
        common = " ".join(f"{k}×{v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:6])
        print(f"region {start:5d}-{start + 63:5d} {region[0][0] if region else ''}: {100 * samples / max(total, 1):5.1f}%  {common}")
    for r in ranked[:top]:
        samples = number(r[total_col])
        reasons = sorted(((number(r[i]), header[i]) for i in reason_cols if number(r[i]) > 0), reverse=True)[:3]
        why = " ".join(f"{name.replace('smsp__pcsamp_warps_issue_stalled_', '')}={v:.0f}" for v, name in reasons)
        print(f"{100 * samples / max(total, 1):5.1f}%  {r[0]:>6}  {r[text_col][:90]:<90}  {why}")


main()
