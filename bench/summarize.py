#!/usr/bin/env python3
"""Turns the RESULT lines of table_bench_gpu / table_bench_cpu logs into markdown tables for RESULTS.md.

    bench/summarize.py bench/results/<log> [...]

One table per configuration (everything on a RESULT line except load and the measured figures), one row per
load, one column per workload, figures in G ops/s (GPU) or M ops/s (CPU)."""
import collections
import re
import sys

MEASURED = {"load", "ops", "ms", "gops", "mops", "bytes_per_pair", "passes", "efficiency_vs_avg_insert_find"}


def parse(path):
    for line in open(path):
        if not line.startswith("RESULT "):
            continue
        fields = line.split()
        workload = fields[1]
        kv = dict(f.split("=", 1) for f in fields[2:] if "=" in f)
        if "load" not in kv:
            continue
        config = " ".join(f"{k}={v}" for k, v in kv.items() if k not in MEASURED)
        rate = kv.get("gops") or kv.get("mops")
        yield config, float(kv["load"]), workload, rate, kv.get("bytes_per_pair")


def main():
    tables = collections.OrderedDict()
    for path in sys.argv[1:]:
        for config, load, workload, rate, bpp in parse(path):
            t = tables.setdefault(config, {"rows": collections.OrderedDict(), "cols": [], "bpp": {}})
            if workload not in t["cols"]:
                t["cols"].append(workload)
            t["rows"].setdefault(round(load, 2), {})[workload] = rate
            if bpp:
                t["bpp"][round(load, 2)] = bpp
    for config, t in tables.items():
        cols = t["cols"] + (["bytes/pair"] if t["bpp"] else [])
        print(f"`{config}`\n")
        print("| load | " + " | ".join(cols) + " |")
        print("| --- " * (len(cols) + 1) + "|")
        for load, row in t["rows"].items():
            cells = [row.get(c, "") for c in t["cols"]] + ([t["bpp"].get(load, "")] if t["bpp"] else [])
            print(f"| {load:.2f} | " + " | ".join(cells) + " |")
        print()


if __name__ == "__main__":
    main()
