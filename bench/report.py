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
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except Exception:  # noqa: BLE001
        return os.environ.get("DSV4_COMMIT", "unknown")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("results_dirs", nargs="+")
    parser.add_argument("--card", help="card name (default: nvidia-smi)")
    parser.add_argument("--commit", help="commit (default: git rev-parse HEAD)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--markdown", required=True)
    args = parser.parse_args()

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

    lines = ["| bench | case | time µs | achieved | % of ceiling | PyTorch µs | speed-up | check |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in records:
        pct = f"{100 * r['ratio']:.0f}%" if r.get("ceiling") else "—"
        base = f"{r['baseline_us']:.1f}" if r.get("baseline_us") else "—"
        speed = f"{r['speedup']:.1f}×" if r.get("speedup") else "—"
        lines.append(f"| {r['bench']} | {r['name']} | {r['time_us']:.2f} | {r['value']:.1f} {r['metric']} | {pct} "
                     f"| {base} | {speed} | {'ok' if r.get('checked') else 'FAILED'} |")
    with open(args.markdown, "w") as f:
        f.write(f"Card: {report['card']}, commit {report['commit']}, {report['date']}\n\n")
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
