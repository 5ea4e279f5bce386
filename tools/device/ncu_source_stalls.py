#!/usr/bin/env python3
"""Warp-stall samples of one kernel per warp-specialised role and per code window.

Input: the CSV of `ncu -i REPORT --page source --csv --print-source sass` for a report taken with
`--section SourceCounters --import-source yes` (one kernel). The SASS is split at its USETMAXREG
instructions (setmaxnreg: each role's code follows its own), and for each part the stall reasons
of its samples are summed; with --windows N, each role's code is also listed in windows of N
instructions (executions, samples, top stall reasons, top opcodes), which finds the loads,
conversions and waits of a role.

  python3 tools/device/ncu_source_stalls.py ws_sass.csv [--windows 50] [--min-samples 40]
"""
import argparse
import collections
import csv


def opcode(text):
    parts = text.split()
    op = parts[1] if parts and parts[0].startswith('@') and len(parts) > 1 else (parts[0] if parts else '')
    return op.split('.')[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('csv')
    ap.add_argument('--windows', type=int, default=0)
    ap.add_argument('--min-samples', type=float, default=40)
    a = ap.parse_args()
    rows = list(csv.reader(open(a.csv)))
    hdr = next(r for r in rows if 'Address' in r and 'Source' in r)
    data = rows[rows.index(hdr) + 1:]
    ix = {h: i for i, h in enumerate(hdr)}
    stalls = [h for h in hdr if h.startswith('stall_') and 'Not Issued' not in h]

    def num(r, h):
        v = r[ix[h]] if ix[h] < len(r) else ''
        return float(v) if v else 0.0

    cuts = [i for i, r in enumerate(data) if 'USETMAXREG' in r[1]]
    bounds = [0] + cuts + [len(data)]
    for a0, b0 in zip(bounds, bounds[1:]):
        name = data[a0][1].strip() if a0 in cuts else 'prologue'
        tot = collections.Counter()
        samples = executed = 0.0
        for r in data[a0:b0]:
            for h in stalls:
                tot[h] += num(r, h)
            samples += num(r, '# Samples')
            executed += num(r, 'Instructions Executed')
        print(f'== {name}: {b0 - a0} instructions, {executed:.0f} executed, {samples:.0f} samples')
        for h, v in tot.most_common(8):
            if v:
                print(f'   {h[6:]:<20} {v:8.0f} {100 * v / max(samples, 1):5.1f}%')
        if a.windows:
            for s in range(a0, b0, a.windows):
                blk = data[s:s + a.windows]
                sm = sum(num(r, '# Samples') for r in blk)
                if sm < a.min_samples:
                    continue
                ex = sum(num(r, 'Instructions Executed') for r in blk)
                c = collections.Counter()
                for r in blk:
                    for h in stalls:
                        c[h] += num(r, h)
                ops = collections.Counter(opcode(r[1]) for r in blk)
                print('   %5d: executed %9.0f samples %5.0f | %s | %s' % (
                    s - a0, ex, sm, ' '.join('%s:%d' % (h[6:], v) for h, v in c.most_common(4) if v),
                    ' '.join('%s %d' % kv for kv in ops.most_common(5))))


if __name__ == '__main__':
    main()
