"""torch.topk on the same shapes as cuda_ops_bench's "topk" rows (uniform random fp32 in [-10, 10)),
timed with CUDA events (median of 20 after 3 warm-ups). Runs on the device; writes OUT/topk_torch.md.

    python3 tools/device/topk_torch.py OUT_DIR
"""
import statistics
import sys

import torch

CASES = [(1, 65536, 512), (1, 1048576, 512), (64, 16384, 512), (4096, 4096, 512), (1, 131072, 2048)]


def main(out_dir: str) -> None:
    lines = [f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}", "",
             "| op | shape | median us (sorted=True) | median us (sorted=False) |", "|---|---|---:|---:|"]
    g = torch.Generator(device="cuda").manual_seed(0)
    for rows, n, k in CASES:
        x = torch.rand(rows, n, device="cuda", generator=g) * 20 - 10
        res = []
        for sort in (True, False):
            times = []
            for i in range(23):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                torch.topk(x, k, dim=-1, largest=True, sorted=sort)
                b.record()
                torch.cuda.synchronize()
                if i >= 3:
                    times.append(a.elapsed_time(b) * 1e3)
            res.append(statistics.median(times))
        lines.append(f"| torch.topk k={k} | {rows}x{n} | {res[0]:.1f} | {res[1]:.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(f"{out_dir}/topk_torch.md", "w") as f:
        f.write(text)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
