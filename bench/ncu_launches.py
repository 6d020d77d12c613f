#!/usr/bin/env python3
"""Bytes per op and time of every kernel of one table_bench_gpu run under Nsight Compute.

Input: the CSV log of `ncu --kernel-name-base demangled --cache-control none --clock-control none
--metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --log-file F
table_bench_gpu --parts=table ...` (gzipped or not). The benchmark's workloads run in a fixed order, each
call ended by a count_status kernel, so launches are assigned to workloads by counting those. For each
workload and kernel: launches of 10 us or more (the first and last of a call left out where there are more
than four), their mean time, DRAM bytes read and written per op of a 4194304-op pass (the split kernels of a
mixed pass: per op of their kind, 55% and 45% of the pass), and DRAM bandwidth.
Usage: bench/ncu_launches.py LOG [--list]   (--list: one line per launch instead)
"""
import collections
import csv
import gzip
import re
import sys

WORKLOADS = ['insert', 'find_hit', 'find_miss', 'overwrite', 'mixed', 'delete']
SHARE = {'split_kernel<R,1,0>': 0.55, 'split_kernel<R,2,1>': 0.45}
PASS_OPS = 4194304


def short(name):
    n = name.replace('detail::', '').replace('<unnamed>::', '').replace('TableRef<8, 0, 1>', 'R')
    n = re.sub(r'^void ', '', n)
    n = re.sub(r'\((unsigned long|Engine|const |Counters|unsigned char).*$', '', n)
    return n.replace(', ', ',')


def launches(path):
    opener = gzip.open if path.endswith('.gz') else open
    with opener(path, 'rt') as f:
        rows = list(csv.reader(line for line in f if line.startswith('"')))
    col = {h: i for i, h in enumerate(rows[0])}
    out = collections.OrderedDict()
    for r in rows[1:]:
        d = out.setdefault(int(r[col['ID']]), {'name': short(r[col['Kernel Name']])})
        d[r[col['Metric Name']]] = float(r[col['Metric Value']].replace(',', ''))
    return out


def main():
    ks = launches(sys.argv[1])
    if '--list' in sys.argv:
        for i, d in ks.items():
            print(i, d['name'], round(d.get('gpu__time_duration.sum', 0) / 1000, 1), 'us',
                  round(d.get('dram__bytes_read.sum', 0) / 2**20, 1), round(d.get('dram__bytes_write.sum', 0) / 2**20, 1), 'MiB')
        return
    acc = collections.defaultdict(list)
    call = 0
    for d in ks.values():
        t = d.get('gpu__time_duration.sum', 0) / 1000
        if d['name'].startswith('bench::count_status'):
            call += 1
            continue
        if d['name'].startswith('bench::') or t < 10 or call >= len(WORKLOADS):
            continue
        acc[(WORKLOADS[call], d['name'])].append((t, d.get('dram__bytes_read.sum', 0), d.get('dram__bytes_write.sum', 0)))
    for (w, name), v in acc.items():
        v = v[1:-1] if len(v) > 4 else v
        n = len(v)
        t = sum(x[0] for x in v) / n
        rd = sum(x[1] for x in v) / n
        wr = sum(x[2] for x in v) / n
        ops = PASS_OPS * SHARE.get(name, 1.0)
        print(f"{w:10s} {name:32s} n={n:2d} {t:7.1f} us  read {rd / ops:6.1f} B/op  written {wr / ops:6.1f} B/op  "
              f"{(rd + wr) / (t * 1e-6) / 1e12:5.2f} TB/s")


if __name__ == '__main__':
    main()
