#!/usr/bin/env python3
"""How many probe units an insert and a miss walk, by slots per unit: a model, not a measurement.

A line holds 7 slots of 8-byte keys and values (5 before its lengths moved beside its ticket word), 4 of
16-byte keys and 8-byte values, and a board word 8 tickets (bench/RESULTS.md, issue 17). This fills a
table from empty with inserts that probe uniformly random units until one has room (double hashing behaves
so), and prints, at each load, the mean number of units the inserts up to it walked (the figure the table
benchmark's insert phase averages over) and the units a lookup of an absent key reads: it stops at the
first unit with a free slot, so 1 / (1 - the share of full units). Usage: bench/unit_walks_model.py
[slots per unit ...]
"""
import random
import sys


def walks(units, slots, loads, seed=1):
    """{load: (mean units an insert walked, units a miss reads)}."""
    rnd = random.Random(seed)
    filled = [0] * units
    walked = inserted = full = 0
    out = {}
    for load in sorted(loads):
        while inserted < load * units * slots:
            unit, steps = rnd.randrange(units), 1
            while filled[unit] >= slots:
                unit, steps = rnd.randrange(units), steps + 1
            filled[unit] += 1
            full += filled[unit] == slots
            walked += steps
            inserted += 1
        out[load] = (walked / inserted, 1 / (1 - full / units))
    return out


if __name__ == "__main__":
    loads = [0.5, 0.8, 0.9, 0.95]
    for slots in [int(a) for a in sys.argv[1:]] or [5, 7, 8]:
        result = walks(2_000_000 // slots, slots, loads)
        print(f"slots per unit {slots}: " +
              ", ".join(f"load {a}: insert {i:.3f}, miss {m:.3f} units" for a, (i, m) in result.items()))
