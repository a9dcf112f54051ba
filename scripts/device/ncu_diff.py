#!/usr/bin/env python3
"""Per-kernel time of the work between two ncu runs (--print-summary per-kernel --csv): the kernels of run B
minus those of run A (e.g. 5 decode steps minus 1), divided by --per (the runs' difference in steps or passes).
Usage: ncu_diff.py A.csv B.csv --per N [--unit us|ms] [--title TEXT] [--top K]"""
import argparse
import csv


def load(path):
    rows = list(csv.reader(open(path)))
    hi = next(i for i, r in enumerate(rows) if 'Kernel Name' in r)
    h = rows[hi]
    ki, ni, ai = h.index('Kernel Name'), h.index('Invocations'), h.index('Average')
    agg = {}
    for r in rows[hi + 1:]:
        if len(r) <= max(ki, ni, ai):
            continue
        # 'void ns::<unnamed>::kernel<…>(params)' → 'ns::kernel'
        name = r[ki].replace('(anonymous namespace)::', '').replace('<unnamed>::', '').replace('void ', '', 1)
        name = name.split('(')[0].split('<')[0].strip()
        n = float(r[ni])
        t = float(r[ai].replace(',', '')) * n  # ns
        a = agg.setdefault(name, [0.0, 0.0])
        a[0] += n
        a[1] += t
    return agg


def main():
    p = argparse.ArgumentParser()
    p.add_argument('a')
    p.add_argument('b')
    p.add_argument('--per', type=float, required=True)
    p.add_argument('--unit', choices=['us', 'ms'], default='us')
    p.add_argument('--title', default='ncu')
    p.add_argument('--top', type=int, default=30)
    o = p.parse_args()
    a, b = load(o.a), load(o.b)
    d = {k: [b[k][0] - a.get(k, [0, 0])[0], b[k][1] - a.get(k, [0, 0])[1]] for k in b}
    scale = o.per * (1e3 if o.unit == 'us' else 1e6)
    tot = sum(v[1] for v in d.values())
    n = sum(v[0] for v in d.values())
    prec = 1 if o.unit == 'us' else 3
    print(f"{o.title}: {tot / scale:.{prec}f} {o.unit} of kernels in {n / o.per:.0f} launches")
    for k, v in sorted(d.items(), key=lambda kv: -kv[1][1])[:o.top]:
        print(f"  {v[1] / scale:9.{prec}f} {o.unit}  {v[0] / o.per:6.1f}x  {k}")


if __name__ == '__main__':
    main()
