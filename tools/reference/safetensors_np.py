"""Minimal safetensors reader/writer (numpy + ml_dtypes) and the moeserve checkpoint loader.

File layout: u64 little-endian header length N, N bytes of JSON header
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then raw bytes
(offsets relative to the end of the header). Sharded checkpoints: model.safetensors.index.json
with {"weight_map": {name: file}}.

Dequantization follows docs/checkpoint_format.md.
"""
from __future__ import annotations

import json
import os
import struct

import numpy as np
import ml_dtypes

from . import formats as F

DTYPES = {
    "BF16": ml_dtypes.bfloat16,
    "F16": np.float16,
    "F32": np.float32,
    "F64": np.float64,
    "F8_E4M3": ml_dtypes.float8_e4m3fn,
    "F8_E8M0": np.uint8,  # raw exponent bytes
    "I8": np.int8,
    "U8": np.uint8,
    "I16": np.int16,
    "I32": np.int32,
    "I64": np.int64,
}


class Tensor:
    """A raw tensor: numpy array in its storage dtype plus the safetensors dtype name."""

    __slots__ = ("dtype", "array")

    def __init__(self, dtype: str, array: np.ndarray):
        self.dtype = dtype
        self.array = array

    def __repr__(self):
        return f"Tensor({self.dtype}, {list(self.array.shape)})"


def read_file(path: str) -> dict[str, Tensor]:
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = info["dtype"]
        if dt not in DTYPES:
            raise ValueError(f"{path}: unsupported dtype {dt} for {name}")
        b, e = info["data_offsets"]
        shape = tuple(info["shape"])
        arr = np.frombuffer(data, dtype=DTYPES[dt], count=(e - b) // np.dtype(DTYPES[dt]).itemsize,
                            offset=base + b).reshape(shape)
        out[name] = Tensor(dt, arr)
    return out


def write_file(path: str, tensors: dict[str, Tensor], metadata: dict | None = None) -> None:
    header = {}
    blobs = []
    off = 0
    for name in sorted(tensors):
        t = tensors[name]
        arr = np.ascontiguousarray(t.array)
        want = np.dtype(DTYPES[t.dtype])
        if arr.dtype != want:
            if arr.dtype.itemsize != want.itemsize:
                raise ValueError(f"{name}: array dtype {arr.dtype} does not match {t.dtype}")
            arr = arr.view(want)
        raw = arr.tobytes()
        header[name] = {"dtype": t.dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((-len(hj)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)


def read_dir(model_dir: str) -> dict[str, Tensor]:
    """All tensors of a checkpoint dir (single model.safetensors or index.json shards)."""
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            wm = json.load(f)["weight_map"]
        out = {}
        for fn in sorted(set(wm.values())):
            out.update(read_file(os.path.join(model_dir, fn)))
        missing = set(wm) - set(out)
        if missing:
            raise ValueError(f"tensors listed in index but missing: {sorted(missing)[:5]}")
        return out
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        return read_file(single)
    out = {}
    for fn in sorted(os.listdir(model_dir)):
        if fn.endswith(".safetensors"):
            out.update(read_file(os.path.join(model_dir, fn)))
    if not out:
        raise FileNotFoundError(f"no safetensors in {model_dir}")
    return out


def dequantize(raw: dict[str, Tensor], dtype=np.float64) -> dict[str, np.ndarray]:
    """Raw checkpoint -> {name: float array}; `.scale` tensors are consumed by their weight."""
    out = {}
    for name, t in raw.items():
        if name.endswith(".scale") and name[: -len(".scale")] + ".weight" in raw:
            continue
        sname = name[: -len(".weight")] + ".scale" if name.endswith(".weight") else None
        if sname is not None and sname in raw:
            s = raw[sname]
            if s.dtype != "F8_E8M0":
                raise ValueError(f"{sname}: expected F8_E8M0, got {s.dtype}")
            if t.dtype == "F8_E4M3":
                if name.endswith("engram.table.weight"):
                    w = F.dequant_row_blocks(t.array, s.array)
                else:
                    w = F.dequant_fp8_block(t.array, s.array)
            elif t.dtype in ("I8", "U8"):
                w = F.dequant_mxfp4(t.array, s.array)
            else:
                raise ValueError(f"{name}: scaled tensor of dtype {t.dtype}")
        else:
            if t.dtype in ("I8", "U8", "I32", "I64", "I16"):
                w = t.array.copy()
                out[name] = w
                continue
            if t.dtype == "F8_E4M3":
                raise ValueError(f"{name}: F8_E4M3 without .scale")
            w = t.array.astype(np.float64)
        out[name] = w.astype(dtype)
    return out


def block_scaled_linears(raw: dict[str, Tensor]) -> frozenset[str]:
    """Names (without '.weight') of the linears a raw checkpoint stores block-scaled: FP8 e4m3 with
    32x32 ue8m0 blocks or MXFP4 (I8/U8 + ue8m0).  The Engram table (FP8 rows) is not a linear.
    These are the linears whose input activations get MXFP8 fake-quant (model.Model.lin)."""
    out = set()
    for name, t in raw.items():
        if not name.endswith(".weight") or name.endswith("engram.table.weight"):
            continue
        if name[: -len(".weight")] + ".scale" in raw and t.dtype in ("F8_E4M3", "I8", "U8"):
            out.add(name[: -len(".weight")])
    return frozenset(out)


def load_config(model_dir: str) -> dict:
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)


def load_model_dir(model_dir: str, dtype=np.float64):
    """-> (config dict (composite HF layout), {name: dequantized array})."""
    return load_config(model_dir), dequantize(read_dir(model_dir), dtype)


def load_model_dir_with_formats(model_dir: str, dtype=np.float64):
    """-> (config dict, {name: dequantized array}, block_scaled_linears of the checkpoint)."""
    raw = read_dir(model_dir)
    return load_config(model_dir), dequantize(raw, dtype), block_scaled_linears(raw)
