"""How one calibration constant moves every validation case: GEMM efficiency x FACTOR.

    .venv/bin/python benchmarks/bench_sensitivity.py                 # x0.9 on six public cases
    .venv/bin/python benchmarks/bench_sensitivity.py --factor 0.8 --only ID ...

Scales ``gemm.eff_max`` of every architecture section that sets it (Ampere, Volta, ...) and the
default, re-prices the cached traces and prints, per case, the predicted iteration time before and
after and the change (Markdown rows, as in docs/calibration.md). A physical constant should move
cases by similar shares (their GEMM share of the critical path), not one case alone.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

DEFAULT_CASES = Path(__file__).resolve().parents[1] / "validation" / "public_cases.yaml"
DEFAULT_IDS = ["e2e-megatron-sc21-t1-1p7b", "e2e-megatron-sc21-t1-18p4b", "e2e-megatron-sc21-t1-145p6b",
               "e2e-megatron2020-dgxa100-mp-1b", "e2e-megatron2020-dgx2v100-mp-1b",
               "e2e-megatron2020-dgxa100-dp128-8b"]


def scaled_model(factor: float):
    """The bundled efficiency model with every ``gemm.eff_max`` multiplied by ``factor``."""
    from kernel_db.roofline import EfficiencyModel, load_efficiency

    em = load_efficiency()

    def scale(section: dict) -> dict:
        out = copy.deepcopy(dict(section))
        if "gemm" in out and "eff_max" in out["gemm"]:
            out["gemm"] = {**out["gemm"], "eff_max": out["gemm"]["eff_max"] * factor}
        return out

    return EfficiencyModel(scale(em.default), {a: scale(s) for a, s in em.arch.items()},
                           {g: scale(s) for g, s in em.gpu.items()}, em.path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=Path, default=DEFAULT_CASES)
    ap.add_argument("--only", nargs="+", default=DEFAULT_IDS)
    ap.add_argument("--factor", type=float, default=0.9)
    a = ap.parse_args(argv)
    from kernel_db import Pricer
    from heterosim.validation.validate import validate

    base = {r.id: r.primary.predicted for r in validate(a.cases, only=a.only).cases}
    moved = {r.id: r.primary.predicted
             for r in validate(a.cases, only=a.only, kernel_db=Pricer(efficiency=scaled_model(a.factor))).cases}
    print(f"| case | T predicted (s) | T with GEMM eff x{a.factor:g} | change |\n|---|---|---|---|")
    for i in a.only:
        print(f"| {i} | {base[i]:.3f} | {moved[i]:.3f} | {100 * (moved[i] / base[i] - 1):+.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
