#!/usr/bin/env python3
"""Merges benchmark records (bench_*.json) with PyTorch baselines (baseline_*.json).

Each record has a "name"; a baseline record with the same name carries "baseline_us". Several result
directories may be given (oldest first): a record measured again in a later directory replaces the
earlier one, so partial re-runs can be folded into a full table. Writes one JSON report (date, commit,
card, sources, records with speed-ups) and a markdown table.
"""
import argparse
import datetime
import glob
import json
import os
import subprocess


def card_name():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except Exception:  # noqa: BLE001 - report what we can
        return "unknown"


def commit():
    # The GPU machine's copy of the tree may carry a stale .git: an explicit DSV4_COMMIT wins.
    if os.environ.get("DSV4_COMMIT"):
        return os.environ["DSV4_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except Exception:  # noqa: BLE001
        return os.environ.get("DSV4_COMMIT", "unknown")


# The issues' targets on the H200: (bench, case-name prefix, what is compared, bound, label).
# "ratio" is the fraction of the ceiling, "time" microseconds (≤), "value" the metric (≥),
# "shape:FIELD" the microseconds (≤) in that field of the record's shape (the per-layer times of a
# graph of several layers' calls); rows whose record lacks the field are left out.
def per_layer(bench, case, bound, label, field="per_call_in_layer_graph_us", unit="a call in a graph of 8 layers' calls"):
    """The target row of a per-layer figure: `label`, measured as `unit`."""
    return (bench, case, f"shape:{field}", bound, f"{label}, {unit}")


TARGETS = [
    ("bench_compressor", "prefill C4-512 T=262144", "ratio", 0.90, "C4-512 prefill 256K ≥ 90% copy"),
    ("bench_compressor", "prefill C4-128 T=262144", "ratio", 0.90, "C4-128 prefill 256K ≥ 90% copy"),
    ("bench_compressor", "prefill C128 T=262144", "ratio", 0.90, "C128 prefill 256K ≥ 90% copy"),
    ("bench_compressor", "prefill C128-online T=262144", "ratio", 0.90, "online C128 prefill 256K ≥ 90% copy"),
] + [
    # Each compressor's one-token decode step at B=256: the step's own graph, and a step in a graph of
    # 8 layers' steps (without the one-kernel graph's launch cost).
    row for kind, label in (("C4-512", "C4-512"), ("C4-128", "C4-128"), ("C128", "C128"),
                            ("C128-online", "online C128"))
    for row in (("bench_compressor", f"decode {kind} B=256 n=1", "time", 8.0, f"{label} decode B=256 ≤ 8 µs"),
                per_layer("bench_compressor", f"decode {kind} B=256 n=1", 8.0, f"{label} decode B=256 ≤ 8 µs",
                          "per_step_in_layer_graph_us", "a step in a graph of 8 layers' steps"))
] + [
    ("bench_indexer", "scores_fp8_b1_n262144_next1", "ratio", 0.80, "FP8 scores B=1 N=256K ≥ 80% copy"),
    ("bench_indexer", "scores_fp4_b1_n262144_next1", "time", 7.0, "FP4 scores B=1 N=256K ≈ 7 µs"),
    per_layer("bench_indexer", "scores_fp8_b1_n262144_next1", 11.0, "FP8 scores B=1 N=256K ≈ 11 µs (80% copy)"),
    per_layer("bench_indexer", "scores_fp4_b1_n262144_next1", 7.0, "FP4 scores B=1 N=256K ≈ 7 µs"),
    per_layer("bench_indexer", "scores_fp8_b1_n262144_next1", 21.0,
              "FP8 scores + top-512 B=1 N=256K ≤ 21 µs (the two targets together)",
              "per_layer_scores_topk512_in_graph_us", "a layer in a graph of 8 layers"),
    ("bench_indexer", "prefill_fp8_t65536", "value", 600.0, "FP8 prefill scores T=64K ≥ 600 TFLOP/s"),
    ("bench_topk", "topk_b1_n262144_k512", "time", 10.0, "top-512 B=1 N=256K ≤ 10 µs"),
    ("bench_topk", "topk_b1_n262144_k512_l2warm", "time", 10.0,
     "top-512 B=1 N=256K ≤ 10 µs, in a graph with the scores in L2 (as in a decode step)"),
    ("bench_topk", "topk_b128_n65536_k512", "time", 80.0, "top-512 B=128 N=64K ≤ 80 µs"),
    ("bench_sparse_attention", "decode_B128_H64_N640_nn1", "value", 400.0, "attention B=128 H=64 640 ≥ 400 TFLOP/s"),
    per_layer("bench_sparse_attention", "decode_B128_H64_N640_nn1", 26.8,
              "attention B=128 H=64 640 ≥ 400 TFLOP/s (≤ 26.8 µs)"),
    ("bench_sparse_attention", "decode_B1_H64_N640_nn1", "time", 12.0, "attention B=1 H=64 640 ≤ 12 µs"),
    ("bench_sparse_attention", "decode_B1_H64_N640_nn1_split64", "time", 12.0,
     "attention B=1 H=64 640 ≤ 12 µs at the latency split (64 candidates a chunk, merged in a cluster)"),
    per_layer("bench_sparse_attention", "decode_B1_H64_N640_nn1", 12.0, "attention B=1 H=64 640 ≤ 12 µs"),
    per_layer("bench_sparse_attention", "decode_B1_H64_N640_nn1_split64", 12.0,
              "attention B=1 H=64 640 ≤ 12 µs at the latency split"),
    ("bench_sparse_attention", "prefill_T4096_H64_N640", "value", 550.0, "attention prefill T=4096 ≥ 550 TFLOP/s"),
]


def target_rows(records):
    rows = ["| target | measured | met |", "|---|---:|---|"]
    for bench, prefix, kind, bound, label in TARGETS:
        rec = next((r for r in records if r["bench"] == bench and r["name"].startswith(prefix)
                    and "_warmcode" not in r["name"]), None)
        if rec is None:
            continue
        if kind.startswith("shape:"):
            us = rec.get("shape", {}).get(kind[len("shape:"):])
            if us is None:
                continue
            shown, met = f"{us:.1f} µs", us <= bound
        elif kind == "time":
            shown, met = f"{rec['time_us']:.1f} µs", rec["time_us"] <= bound
        elif kind == "ratio":
            shown, met = f"{100 * rec['ratio']:.0f}% ({rec['time_us']:.1f} µs)", rec["ratio"] >= bound
        else:
            shown, met = f"{rec['value']:.0f} {rec['metric']} ({rec['time_us']:.1f} µs)", rec["value"] >= bound
        rows.append(f"| {label} | {shown} | {'yes' if met else 'no'} |")
    return rows


def table_rows(records):
    rows = ["| bench | case | time µs | achieved | % of ceiling | PyTorch µs | speed-up | check |",
            "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in records:
        pct = f"{100 * r['ratio']:.0f}%" if r.get("ceiling") else "—"
        base = f"{r['baseline_us']:.1f}" if r.get("baseline_us") else "—"
        speed = f"{r['speedup']:.1f}×" if r.get("speedup") else "—"
        rows.append(f"| {r['bench']} | {r['name']} | {r['time_us']:.2f} | {r['value']:.1f} {r['metric']} | {pct} "
                    f"| {base} | {speed} | {'ok' if r.get('checked') else 'FAILED'} |")
    return rows


def write_markdown(report, markdown_path, targets_path=None):
    with open(markdown_path, "w") as f:
        f.write(f"Card: {report['card']}, commit {report['commit']}, {report['date']}\n\n")
        f.write("\n".join(table_rows(report["records"])) + "\n")
    if targets_path:
        with open(targets_path, "w") as f:
            f.write("\n".join(target_rows(report["records"])) + "\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("results_dirs", nargs="+")
    parser.add_argument("--card", help="card name (default: nvidia-smi)")
    parser.add_argument("--commit", help="commit (default: git rev-parse HEAD)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--markdown", required=True)
    parser.add_argument("--targets", help="also write the targets table here (markdown)")
    parser.add_argument("--from-report", action="store_true",
                        help="the single positional argument is a stored report JSON: only rewrite the tables")
    args = parser.parse_args()
    if args.from_report:
        write_markdown(json.load(open(args.results_dirs[0])), args.markdown, args.targets)
        return

    by_name, baselines, extras = {}, {}, {}
    for directory in args.results_dirs:
        for path in sorted(glob.glob(os.path.join(directory, "bench_*.json"))):
            for rec in json.load(open(path)):
                rec["source"] = directory
                by_name[(rec["bench"], rec["name"])] = rec
        for path in sorted(glob.glob(os.path.join(directory, "baseline_*.json"))):
            for rec in json.load(open(path)):
                if "name" in rec and "baseline_us" in rec:
                    baselines[rec["name"]] = rec["baseline_us"]
                else:
                    extras.update(rec)
    records = list(by_name.values())
    for rec in records:
        base = baselines.get(rec["name"])
        rec["baseline_us"] = base
        rec["speedup"] = base / rec["time_us"] if base and rec["time_us"] > 0 else None

    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "commit": args.commit or commit(), "card": args.card or card_name(), "sources": args.results_dirs, "extras": extras, "records": records}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)

    write_markdown(report, args.markdown, args.targets)


if __name__ == "__main__":
    main()
