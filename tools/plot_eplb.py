#!/usr/bin/env python3
"""Plot a `moeserve bench eplb` result: balance over time and per layer, per model.

usage: plot_eplb.py RESULT.json OUT.png

One row per simulated model (target, draft). Left: per-step balance (mean rank load / max rank
load, averaged over layers and timeline buckets) without EPLB, with EPLB and under uniform
routing, with the re-plan steps marked. Right: per-layer balance over the scored steps and the
share of the gap to uniform that EPLB recovers.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        result = json.load(f)
    models = [m for m in ("target", "draft") if m in result["results"]]
    if not models:
        print("no target/draft results in " + sys.argv[1], file=sys.stderr)
        return 1
    cfg = result["config"]
    fig, axes = plt.subplots(len(models), 2, figsize=(13, 4.2 * len(models)), squeeze=False,
                             gridspec_kw={"width_ratios": [2.2, 1]})
    colors = {"none": "tab:red", "eplb": "tab:blue", "uniform": "tab:gray"}
    for row, name in enumerate(models):
        r = result["results"][name]
        shape = r["shape"]
        sb = r["step_balance"]
        tl = r["timeline"]
        ax = axes[row][0]
        for key, label in (("uniform", "uniform routing"), ("eplb", "EPLB"), ("none", "no EPLB")):
            ax.plot(tl["step"], tl[key], color=colors[key], lw=1.2,
                    label=f"{label} (mean {sb[key]:.3f})")
        for i, ev in enumerate(r["rebalances"]):
            ax.axvline(ev["step"], color="tab:green", ls=":", lw=1,
                       label="re-plan" if i == 0 else None)
        ax.axvspan(0, r["first_plan_step"], color="0.93", zorder=0, label="first window (unscored)")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("decode step")
        ax.set_ylabel("balance (mean / max rank load)")
        src = f"replay {shape['replay']}" if shape.get("replay") else f"Zipf s={shape['zipf_exponent']}"
        ax.set_title(f"{name}: {shape['num_experts']} experts top-{shape['top_k']}, "
                     f"{cfg['num_ranks']} ranks x {shape['tokens_per_rank']} tokens, "
                     f"{shape['num_slots']} slots, {src}; recovered {100 * sb['recovered']:.1f}%",
                     fontsize=9)
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(alpha=0.3)

        ax = axes[row][1]
        layers = r["per_layer"]
        xs = list(range(len(layers)))
        w = 0.27
        for off, key in ((-w, "none"), (0.0, "eplb"), (w, "uniform")):
            ax.bar([x + off for x in xs], [lb[key] for lb in layers], w, color=colors[key],
                   label=key)
        for x, lb in zip(xs, layers):
            ax.text(x, min(1.0, lb["eplb"]) + 0.02, f"{100 * lb['recovered']:.0f}%", ha="center",
                    fontsize=7)
        ax.set_ylim(0, 1.1)
        ax.set_xticks(xs)
        ax.set_xlabel("MoE layer")
        ax.set_title("per layer (label: gap recovered)", fontsize=9)
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"moeserve bench eplb  (W={cfg['window_steps']}, K={cfg['rebalance_interval']}, "
                 f"mode {cfg['mode']}, replica rule {cfg['replica_rule']}, commit {result['commit']})",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
