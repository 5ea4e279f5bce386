#!/usr/bin/env python3
"""Plots `moeserve bench serve` / `bench sweep` result JSONs (docs/benchmarks.md).

    python3 tools/plot_bench.py --out-dir DIR results/serve_c*.json

Writes, under DIR:
  throughput_vs_interactivity.png  total tokens/s per GPU vs E2E-normalised interactivity at P90
                                   (the AgentX "North Star" view), Pareto frontier highlighted,
                                   each point labelled with its concurrency (or request rate)
  latency_percentiles.png          TTFT, TPOT, ITL and E2E at P50/P90/P99 vs concurrency
  throughput_vs_concurrency.png    tokens/s per GPU (total, input, output) vs concurrency
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(paths):
    runs = []
    for p in paths:
        with open(p) as f:
            j = json.load(f)
        if j.get("benchmark") != "serve":
            print(f"skipping {p}: not a serve result", file=sys.stderr)
            continue
        cfg, res = j["config"], j["results"]
        x = cfg.get("request_rate") or 0
        runs.append({
            "path": p,
            "conc": cfg.get("concurrency", 0),
            "rate": x,
            "label": f"rate {x:g}/s" if x else f"c={cfg.get('concurrency')}",
            "res": res,
            "cfg": cfg,
        })
    runs.sort(key=lambda r: (r["rate"], r["conc"]))
    return runs


def pareto(points):
    """Indices of points not dominated when maximising both coordinates."""
    keep = []
    for i, (x, y) in enumerate(points):
        if not any((x2 >= x and y2 >= y) and (x2 > x or y2 > y) for x2, y2 in points):
            keep.append(i)
    return sorted(keep, key=lambda i: points[i][0])


NOTE = ""  # --note: an extra title line (hardware, build, caveats)


def title_suffix(runs):
    c = runs[0]["cfg"]
    wl = f"trace {os.path.basename(c['trace'])}" if c.get("workload") == "trace" else \
        f"random ISL {c.get('isl')} / OSL {c.get('osl')}"
    s = f"{c.get('model', '')} — {wl} — {c.get('num_gpus', 1)} GPU(s)"
    return s + ("\n" + NOTE if NOTE else "")


def plot_pareto(runs, out):
    pts = [(r["res"]["interactivity_p90"], r["res"]["total_tok_s_per_gpu"]) for r in runs]
    fig, ax = plt.subplots(figsize=(7, 5))
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], color="tab:blue", zorder=3)
    for r, (x, y) in zip(runs, pts):
        ax.annotate(r["label"], (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    front = pareto(pts)
    ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], color="tab:red",
            label="Pareto frontier", zorder=2)
    ax.margins(0.12)
    ax.set_xlabel("E2E-normalised interactivity, P90 (tokens/s/user) = 1 / P90(E2EL / OSL)")
    ax.set_ylabel("total tokens/s per GPU (cached + uncached input + output)")
    ax.set_title("Throughput vs interactivity\n" + title_suffix(runs), fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_latency(runs, out):
    xs = [r["conc"] if not r["rate"] else r["rate"] for r in runs]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (key, name) in zip(axes.flat, [("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"),
                                           ("itl_ms", "ITL"), ("e2e_ms", "E2E latency")]):
        for q, style in [("p50", "o-"), ("p90", "s--"), ("p99", "^:")]:
            ax.plot(xs, [r["res"][key][q] for r in runs], style, label=q.upper())
        ax.set_title(name)
        ax.set_xlabel("request rate (/s)" if runs[0]["rate"] else "concurrency")
        ax.set_ylabel("ms")
        if not runs[0]["rate"] and len(xs) > 1 and max(xs) / max(1, min(xs)) >= 8:
            ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Latency percentiles — " + title_suffix(runs), fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_throughput(runs, out):
    xs = [r["conc"] if not r["rate"] else r["rate"] for r in runs]
    fig, ax = plt.subplots(figsize=(7, 5))
    for key, name in [("total_tok_s_per_gpu", "total"), ("input_tok_s_per_gpu", "input"),
                      ("output_tok_s_per_gpu", "output")]:
        ax.plot(xs, [r["res"][key] for r in runs], "o-", label=name)
    ax.set_xlabel("request rate (/s)" if runs[0]["rate"] else "concurrency")
    ax.set_ylabel("tokens/s per GPU")
    if not runs[0]["rate"] and len(xs) > 1 and max(xs) / max(1, min(xs)) >= 8:
        ax.set_xscale("log", base=2)
    ax.set_title("Throughput per GPU\n" + title_suffix(runs), fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("results", nargs="+", help="serve result JSON files")
    ap.add_argument("--out-dir", default=".", help="where the PNGs go")
    ap.add_argument("--note", default="", help="extra title line, e.g. 'CPU, 2 cores, Release'")
    args = ap.parse_args()
    global NOTE
    NOTE = args.note
    runs = load(args.results)
    if not runs:
        sys.exit("no serve results to plot")
    os.makedirs(args.out_dir, exist_ok=True)
    outs = [os.path.join(args.out_dir, n) for n in
            ("throughput_vs_interactivity.png", "latency_percentiles.png",
             "throughput_vs_concurrency.png")]
    plot_pareto(runs, outs[0])
    plot_latency(runs, outs[1])
    plot_throughput(runs, outs[2])
    for o in outs:
        print("wrote", o)


if __name__ == "__main__":
    main()
