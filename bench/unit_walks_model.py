#!/usr/bin/env python3
"""How many probe units an insert walks while a table fills, by slots per unit: a model, not a measurement.

A line holds 5 slots of 8-byte keys and values, a board word 8 tickets (bench/RESULTS.md, issue 17). This
fills a table from empty with inserts that probe uniformly random units until one has room (double hashing
behaves so), and prints, at each load, the mean number of units the inserts up to it walked: the figure
the table benchmark's insert phase averages over. Usage: bench/unit_walks_model.py [slots per unit ...]
"""
import random
import sys


def mean_walks(units, slots, loads, seed=1):
    rnd = random.Random(seed)
    filled = [0] * units
    walked = inserted = 0
    out = {}
    for load in sorted(loads):
        while inserted < load * units * slots:
            unit, steps = rnd.randrange(units), 1
            while filled[unit] >= slots:
                unit, steps = rnd.randrange(units), steps + 1
            filled[unit] += 1
            walked += steps
            inserted += 1
        out[load] = walked / inserted
    return out


if __name__ == "__main__":
    loads = [0.5, 0.8, 0.9, 0.95]
    for slots in [int(a) for a in sys.argv[1:]] or [5, 8]:
        walks = mean_walks(2_000_000 // slots, slots, loads)
        print(f"slots per unit {slots}: " + ", ".join(f"load {a}: {w:.3f} units" for a, w in walks.items()))
