"""Unit-level parity of the numpy oracle with HF transformers' `deepseek_v4` (issue 3 item 6).

No released transformers ships `models/deepseek_v41` (docs/transformers_comparison.md), so only
the parts V4.1 shares with V4 are compared: mHC coefficients/Sinkhorn/collapse/expand, the router,
the MoE block, RoPE/YaRN frequencies and rotation, SWA attention with sinks, FP8/MXFP4 weight
dequant and the e4m3 cast.  The checks live in tools/reference/compare_transformers.py.

Skips (CI stays green) unless torch and transformers >= 5.8.0 (models/deepseek_v4) are importable:
    python -m pytest tests/reference/test_transformers_parity.py -q
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from tools.reference import compare_transformers as CT  # noqa: E402

_OK, _WHY = CT.import_status()
pytestmark = pytest.mark.skipif(not _OK, reason=f"transformers parity needs torch + transformers>=5.8: {_WHY}")


@pytest.mark.parametrize("check", CT.CHECKS, ids=[c.__name__[len("check_"):] for c in CT.CHECKS])
def test_parity(check):
    r = check()
    lines = [f"{label}: max|diff|={d:.3e} max|ref|={m:.3e} rel={rel:.3e}" for label, d, m, rel in r["parts"]]
    msg = f"{r['name']} (tol {'exact' if r['exact'] else r['tol']}; {r['extra']}):\n  " + "\n  ".join(lines)
    assert r["ok"], msg
