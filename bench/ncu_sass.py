#!/usr/bin/env python3
"""Where one kernel's warps wait, instruction by instruction, from Nsight Compute's source page.

Input: the CSV of `ncu --import REPORT --page source --print-source sass --csv` for a report with the
SourceCounters section (bench/device/ncu_mixed.sh and ncu_stalls.sh write them as *-sass.csv, gzipped or not).
It holds one block per profiled kernel, each opened by a "Kernel Name" line; pick one with --kernel (from 0).

Prints the kernel's warp-stall samples by reason, the instructions that hold the most samples (with the
lanes active and how often a warp ran them), and the shape of its walk: warps of 32 ops (the most frequent
execution count of an instruction all 32 lanes run, over 10000), the executions of the busiest instruction
per such warp (for the probing kernels, the walk loop's iterations a warp of ops runs) and warp instructions
per warp of ops.
Usage: bench/ncu_sass.py SASS_CSV [--kernel N] [--top N]
"""
import argparse
import collections
import csv
import gzip
import io


def blocks(path):
    opener = gzip.open if path.endswith('.gz') else open
    with opener(path, 'rt') as f:
        text = f.read()
    out = []
    for block in text.split('"Kernel Name",')[1:]:
        name, rest = block.split('\n', 1)
        out.append((name.strip().strip(',').strip('"'), list(csv.DictReader(io.StringIO(rest)))))
    return out


def num(x):
    try:
        return float(x.replace(',', ''))
    except (AttributeError, ValueError):
        return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('path')
    ap.add_argument('--kernel', type=int, default=0)
    ap.add_argument('--top', type=int, default=20)
    a = ap.parse_args()
    name, rows = blocks(a.path)[a.kernel]
    print(name[:200])
    samples = sum(num(r['Warp Stall Sampling (All Samples)']) for r in rows)
    reasons = [k for k in rows[0] if k.startswith('stall_') and 'Not Issued' not in k]
    by_reason = {k: sum(num(r[k]) for r in rows) for k in reasons}
    print('stall samples %d; by reason: %s' % (samples, ', '.join(
        '%s %.1f%%' % (k[6:], 100 * v / samples) for k, v in sorted(by_reason.items(), key=lambda x: -x[1])
        if v / samples > 0.01)))
    executed = [(num(r['Instructions Executed']), num(r['Avg. Threads Executed'])) for r in rows]
    full = collections.Counter(e for e, t in executed if t == 32 and e > 10000)
    if full:
        warps = full.most_common(1)[0][0]
        busiest = max(executed)
        instructions = sum(e for e, _ in executed)
        print('warps of 32 ops %d; busiest instruction %.2f times a warp of ops with %.0f lanes active; '
              '%.0f warp instructions a warp of ops' % (warps, busiest[0] / warps, busiest[1], instructions / warps))
    ranked = sorted(enumerate(rows), key=lambda x: -num(x[1]['Warp Stall Sampling (All Samples)']))[:a.top]
    for i, r in ranked:
        s = num(r['Warp Stall Sampling (All Samples)'])
        top2 = sorted(((num(r[k]), k[6:]) for k in reasons), reverse=True)[:2]
        print('%5d %5.1f%% lanes %5s runs %9s  %-60s %s' % (i, 100 * s / samples, r['Avg. Threads Executed'],
                                                         r['Instructions Executed'], r['Source'][:60],
                                                         ' '.join('%s:%d' % (k, v) for v, k in top2)))


if __name__ == '__main__':
    main()
