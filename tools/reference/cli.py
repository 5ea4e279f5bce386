"""Command line for the numpy oracle.  See README.md.

  python -m tools.reference dump --model DIR --ids 1,2,3 --mode oracle|production --out F.npz [--draft]
  python -m tools.reference gen-tiny OUT_DIR [--seed 0]
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from .dspark import draft
from .model import Model


def _ints(s):
    if not s:
        return []
    return [int(v) for v in s.replace(" ", "").split(",") if v != ""]


def dump(a) -> dict:
    if a.ids_file:
        ids = np.loadtxt(a.ids_file, dtype=np.int64, delimiter=",").ravel()
    else:
        ids = np.array(_ints(a.ids), dtype=np.int64)
    if len(ids) == 0:
        raise SystemExit("no ids")
    cmap = np.load(a.cmap) if a.cmap else None
    m = Model.from_dir(a.model, compressed_map=cmap, moe_norm_top1=(a.moe_norm_top1 == "always"),
                       act_quant=not a.no_act_quant)
    image = np.zeros(len(ids), dtype=bool)
    for p in _ints(a.image_pos):
        image[p] = True
    st = m.forward(ids, a.mode, image)
    c = m.cfg
    out = {
        "ids": ids,
        "rows": st["rows"].astype(np.int64),
        "logits": st["logits"],
        "logits_last": st["logits"][-1],
        "image_mask": image.astype(np.uint8),
        "encoder_out": st["encoder_out"],
    }
    for l, cache in st["caches"].items():
        out[f"cache.{l}.main"] = cache["main"]
        out[f"cache.{l}.idxk"] = cache["idxk"]
        out[f"cache.{l}.latent"] = cache["latent"]
    if c.cand in st["caches"]:
        out["cand_main"] = st["caches"][c.cand]["main"]
        out["cand_idxk"] = st["caches"][c.cand]["idxk"]
    if "cand_mask" in st:
        out["cand_mask"] = st["cand_mask"].astype(np.uint8)
    for l, s in st["sel"].items():
        out[f"sel.{l}"] = s.astype(np.uint8)
        out[f"index_scores.{l}"] = st["scores"][l]
    for l, e in st["experts"].items():
        out[f"experts.{l}"] = e.astype(np.int64)
    for l, h in st["hash"].items():
        out[f"engram_ids.{l}"] = h
    if a.layers:
        for l, (rows, X) in st["layer_out"].items():
            out[f"layer_rows.{l}"] = rows.astype(np.int64)
            out[f"layer_out.{l}"] = X
            out[f"attn_in.{l}"] = st["attn_in"][l][1]
    if "main_hidden" in st:
        out["main_hidden"] = st["main_hidden"]
        out["main_hidden_pos"] = st["main_hidden_pos"].astype(np.int64)
    if a.draft:
        anchor = a.anchor if a.anchor is not None else int(np.argmax(st["logits"][-1]))
        r = draft(m, st["main_hidden"], st["main_hidden_pos"], anchor)
        out.update({"draft_anchor": np.array([anchor], dtype=np.int64), "draft_U": r["U"],
                    "draft_l": r["l"], "draft_d": r["d"], "draft_c": r["c"],
                    "draft_positions": r["positions"].astype(np.int64),
                    "draft_ctx_pos": r["ctx_pos"].astype(np.int64)})
    dt = np.float32 if a.float32 else np.float64
    out = {k: (v.astype(dt) if np.issubdtype(np.asarray(v).dtype, np.floating) else np.asarray(v))
           for k, v in out.items()}
    if a.out.endswith(".safetensors"):
        from .safetensors_np import Tensor, write_file
        names = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.int64): "I64",
                 np.dtype(np.uint8): "U8"}
        write_file(a.out, {k: Tensor(names[np.asarray(v).dtype], np.asarray(v)) for k, v in out.items()},
                   {"mode": a.mode})
    else:
        np.savez(a.out, **out)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tools.reference")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump", help="run the oracle and write outputs")
    d.add_argument("--model", required=True, help="checkpoint dir (config.json + safetensors)")
    d.add_argument("--ids", default="", help="comma-separated token ids (positions 0..T-1)")
    d.add_argument("--ids-file", default=None, help="text file with comma/newline-separated ids")
    d.add_argument("--mode", choices=["oracle", "production"], default="oracle")
    d.add_argument("--out", required=True, help="output .npz (or .safetensors)")
    d.add_argument("--draft", action="store_true", help="also run one DSpark draft cycle")
    d.add_argument("--anchor", type=int, default=None, help="draft anchor (default argmax of last logits)")
    d.add_argument("--image-pos", default="", help="comma-separated positions that are image tokens")
    d.add_argument("--cmap", default=None, help=".npy int array [vocab] Engram compressed map (-1 DEAD)")
    d.add_argument("--no-act-quant", action="store_true",
                   help="no MXFP8 activation fake-quant before FP8/MXFP4 linears (spec §5 [UNCERTAIN])")
    d.add_argument("--moe-norm-top1", choices=["always", "skip"], default="always",
                   help="normalize routing weights when top-k == 1 (default always; spec §5)")
    d.add_argument("--layers", action="store_true",
                   help="also dump per-layer attn_in.{l} [rows,D], layer_out.{l} [rows,HC,D], layer_rows.{l}")
    d.add_argument("--float32", action="store_true", help="store float arrays as float32")
    g = sub.add_parser("gen-tiny", help="write the spec §9 tiny checkpoint")
    g.add_argument("out_dir")
    g.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.cmd == "dump":
        out = dump(a)
        print(f"wrote {a.out}: logits {out['logits'].shape}", file=sys.stderr)
    else:
        from .make_tiny import generate
        print(generate(a.out_dir, a.seed))


if __name__ == "__main__":
    main()
