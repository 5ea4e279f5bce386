"""Number formats and fake-quant functions of DeepSeek-V4.1 (spec model.md §1.3, §2.2, §2.3).

Everything here is pure numpy (+ ml_dtypes for byte views). Values are returned as float64
arrays whose values lie exactly on the target grid ("fake quant"). Rounding is implemented by
hand (not through ml_dtypes casts) so that float64 inputs are rounded once, with
round-to-nearest-even, and saturation is explicit.
"""
from __future__ import annotations

import numpy as np
import ml_dtypes

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
E4M3_MAX = 448.0
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


# ----------------------------------------------------------------------------- scalar grids
def bf16_round(x):
    """Round float64 to bfloat16 with one RNE rounding (IEEE: overflow -> inf, NaN kept).

    Implemented by hand: ml_dtypes' float64->bfloat16 cast may double-round through float32.
    """
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    with np.errstate(invalid="ignore", over="ignore"):
        a_fin = np.where(np.isfinite(a), a, 0.0)
        _, e = np.frexp(a_fin)
        ex = np.maximum(e - 1, -126)
        q = np.ldexp(1.0, ex - 7)
        r = np.rint(a_fin / q) * q
        r = np.where(r >= 2.0**128, np.inf, r)
        r = np.where(np.isfinite(a), r, a)
    return np.copysign(r, x)


def e4m3_round(x):
    """Round to OCP e4m3fn, finite/saturating, RNE.  |x| > 448 (incl. inf) -> ±448; NaN -> NaN.

    Subnormals: spacing 2^-9 below 2^-6. -0 stays -0.
    """
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    with np.errstate(invalid="ignore", over="ignore"):
        a_fin = np.where(np.isfinite(a), a, E4M3_MAX)
        _, e = np.frexp(a_fin)          # a = m * 2^e, m in [0.5, 1)
        ex = np.maximum(e - 1, -6)      # floor(log2 a), clamped to the subnormal binade
        q = np.ldexp(1.0, ex - 3)       # 3 mantissa bits
        r = np.rint(a_fin / q) * q      # a/q is exact (power-of-two scale); rint is RNE
        r = np.minimum(r, E4M3_MAX)
        r = np.where(np.isnan(x), np.nan, r)
    return np.copysign(r, x)


def e2m1_round(x):
    """Round to the FP4 e2m1 grid {0,.5,1,1.5,2,3,4,6}, saturating at ±6, RNE on the code.

    Ties: .25->0, .75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4 (spec §2.3). NaN -> NaN.
    """
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    r = np.select(
        [a <= 0.25, a < 0.75, a <= 1.25, a < 1.75, a <= 2.5, a < 3.5, a <= 5.0],
        [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0],
        6.0,
    )
    r = np.where(np.isnan(x), np.nan, r)
    return np.copysign(r, x)


def e2m1_encode(x):
    """Values already on the e2m1 grid -> 4-bit codes (sign<<3 | code)."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    code = np.searchsorted(E2M1_GRID, a)
    if not np.all(E2M1_GRID[np.minimum(code, 7)] == a):
        raise ValueError("e2m1_encode: value not on grid")
    sign = np.signbit(x).astype(np.uint8)
    return (sign << 3) | code.astype(np.uint8)


def e2m1_decode(nib):
    nib = np.asarray(nib, dtype=np.uint8)
    v = E2M1_GRID[nib & 7]
    return np.where(nib & 8, -v, v)


def pack_fp4(codes):
    """[..., 2n] nibble codes -> [..., n] int8; element 2i low nibble, 2i+1 high nibble."""
    codes = np.asarray(codes, dtype=np.uint8)
    b = (codes[..., 0::2] & 0xF) | ((codes[..., 1::2] & 0xF) << 4)
    return b.astype(np.uint8).view(np.int8)


def unpack_fp4(packed):
    """[..., n] int8/uint8 -> [..., 2n] float64 e2m1 values."""
    b = np.asarray(packed).view(np.uint8)
    out = np.empty(b.shape[:-1] + (b.shape[-1] * 2,), dtype=np.float64)
    out[..., 0::2] = e2m1_decode(b & 0xF)
    out[..., 1::2] = e2m1_decode(b >> 4)
    return out


def ue8m0_decode(b):
    """F8_E8M0 byte -> 2^(b-127); 255 -> NaN."""
    b = np.asarray(b).view(np.uint8).astype(np.int64)
    v = np.ldexp(1.0, b - 127)
    return np.where(b == 255, np.nan, v)


def ue8m0_encode(s):
    """Power-of-two scale -> byte."""
    s = np.asarray(s, dtype=np.float64)
    m, e = np.frexp(s)
    if not np.all(m == 0.5):
        raise ValueError("ue8m0_encode: not a power of two")
    b = e - 1 + 127
    if np.any((b < 0) | (b > 254)):
        raise ValueError("ue8m0_encode: out of range")
    return b.astype(np.uint8)


def e4m3_encode(x):
    """Values on the e4m3 grid -> bytes (uint8)."""
    x = np.asarray(x, dtype=np.float64)
    y = x.astype(np.float32).astype(E4M3)
    if not np.array_equal(y.astype(np.float64), x, equal_nan=True):
        raise ValueError("e4m3_encode: value not on grid")
    return y.view(np.uint8)


def e4m3_decode(b):
    return np.asarray(b).view(np.uint8).view(E4M3).astype(np.float64)


def pow2_ceil_from_f32_bits(v32):
    """2^ceil(log2 v) computed the reference way from float32 bits: exponent-127 + (mantissa != 0).

    v32 must be float32, positive and normal.  NaN -> NaN.
    """
    v32 = np.asarray(v32, dtype=np.float32)
    bits = v32.view(np.uint32).astype(np.int64)
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0)
    return np.where(np.isnan(v32), np.nan, np.ldexp(1.0, e))


# ----------------------------------------------------------------------------- fake quant
def _blocks(x, block):
    x = np.asarray(x, dtype=np.float64)
    if x.shape[-1] % block:
        raise ValueError(f"last dim {x.shape[-1]} not divisible by block {block}")
    return x.reshape(x.shape[:-1] + (x.shape[-1] // block, block))


def _amax(xb):
    # NOTE: NaN in a block poisons the whole block (like torch amax propagating NaN).
    return np.max(np.abs(xb), axis=-1, keepdims=True)


def fq_fp8(x, block=32):
    """Window-KV QAT (spec §2.2): per block amax.clamp_min(1e-4), s = 2^ceil(log2(amax/448))
    from fp32 bits, x_q = e4m3(clamp(x/s, ±448)) * s."""
    xb = _blocks(x, block)
    amax = _amax(xb).astype(np.float32)
    amax = np.maximum(amax, np.float32(1e-4))
    s = pow2_ceil_from_f32_bits(amax / np.float32(448.0))
    y = e4m3_round(np.clip(xb / s, -E4M3_MAX, E4M3_MAX)) * s
    return y.reshape(np.shape(x))


def fq_fp4_e4m3(x, block=16):
    """Main-cache FP4 (spec §2.3): s = e4m3(max(amax, 6*2^-9)/6), x_q = e2m1(x/s) * s."""
    xb = _blocks(x, block)
    amax = _amax(xb).astype(np.float32)
    amax = np.maximum(amax, np.float32(6.0 * 2.0**-9))
    s = e4m3_round((amax / np.float32(6.0)).astype(np.float64))
    y = e2m1_round(np.clip(xb / s, -6.0, 6.0)) * s
    return y.reshape(np.shape(x))


def fq_fp4_ue8m0(x, block=32):
    """Index keys / index queries FP4 (spec §2.3): s = 2^ceil(log2(max(amax, 6*2^-126)/6))."""
    xb = _blocks(x, block)
    amax = _amax(xb).astype(np.float32)
    amax = np.maximum(amax, np.float32(6.0 * 2.0**-126))
    s = pow2_ceil_from_f32_bits(amax / np.float32(6.0))
    y = e2m1_round(np.clip(xb / s, -6.0, 6.0)) * s
    return y.reshape(np.shape(x))


# ----------------------------------------------------------------------------- weight (de)quant
def dequant_fp8_block(w_bytes, scale_bytes, block=32):
    """FP8 linear: e4m3 [out,in] * 2^(scale[i//32, j//32]-127)."""
    w = e4m3_decode(w_bytes)
    s = ue8m0_decode(scale_bytes)
    out, inp = w.shape
    s = np.repeat(np.repeat(s, block, axis=0), block, axis=1)[:out, :inp]
    return w * s


def dequant_row_blocks(w_bytes, scale_bytes, block=32):
    """Engram table: e4m3 [rows, hd] * 2^(scale[r, c//32]-127)."""
    w = e4m3_decode(w_bytes)
    s = np.repeat(ue8m0_decode(scale_bytes), block, axis=1)[:, : w.shape[1]]
    return w * s


def dequant_mxfp4(w_packed, scale_bytes, block=32):
    """MXFP4 linear: I8 [out, in/2] packed e2m1 * 2^(scale[r, k//32]-127)."""
    w = unpack_fp4(w_packed)
    s = np.repeat(ue8m0_decode(scale_bytes), block, axis=1)[:, : w.shape[1]]
    return w * s


def quant_fp8_block(w, block=32):
    """float weight [out,in] -> (e4m3 bytes, ue8m0 bytes) with s = 2^ceil(log2(amax/448))."""
    w = np.asarray(w, dtype=np.float64)
    out, inp = w.shape
    bo, bi = -(-out // block), -(-inp // block)
    pad = np.zeros((bo * block, bi * block))
    pad[:out, :inp] = w
    amax = np.abs(pad.reshape(bo, block, bi, block)).max(axis=(1, 3)).astype(np.float32)
    amax = np.maximum(amax, np.float32(1e-30))
    s = pow2_ceil_from_f32_bits(amax / np.float32(448.0))
    sf = np.repeat(np.repeat(s, block, 0), block, 1)[:out, :inp]
    q = e4m3_round(w / sf)
    return e4m3_encode(q), ue8m0_encode(s)


def quant_row_blocks_fp8(w, block=32):
    w = np.asarray(w, dtype=np.float64)
    rows, cols = w.shape
    nb = -(-cols // block)
    pad = np.zeros((rows, nb * block))
    pad[:, :cols] = w
    amax = np.abs(pad.reshape(rows, nb, block)).max(axis=2).astype(np.float32)
    amax = np.maximum(amax, np.float32(1e-30))
    s = pow2_ceil_from_f32_bits(amax / np.float32(448.0))
    q = e4m3_round(w / np.repeat(s, block, 1)[:, :cols])
    return e4m3_encode(q), ue8m0_encode(s)


def quant_mxfp4(w, block=32):
    """float [out,in] -> (packed int8 [out,in/2], ue8m0 [out, ceil32(in)])."""
    w = np.asarray(w, dtype=np.float64)
    rows, cols = w.shape
    assert cols % block == 0 and cols % 2 == 0
    wb = w.reshape(rows, cols // block, block)
    amax = np.abs(wb).max(axis=2).astype(np.float32)
    amax = np.maximum(amax, np.float32(6.0 * 2.0**-126))
    s = pow2_ceil_from_f32_bits(amax / np.float32(6.0))
    q = e2m1_round(np.clip(wb / s[..., None], -6, 6)).reshape(rows, cols)
    return pack_fp4(e2m1_encode(q)), ue8m0_encode(s)
