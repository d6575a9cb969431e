"""int8 against bf16 and fp32 for the linear layers of label scoring (issue 77, first part): SmolLM2-135M's
projection shapes (fused q/k/v, o, fused gate/up, down) at a scoring batch of ``--tokens`` rows, each dtype in the
same run on the same machine. int8 is :class:`epr.lm.int8_linear.Int8Linear` with its per-row activation
quantisation counted; bf16 is ``F.linear`` on bf16 tensors (oneDNN's bf16 path); fp32 both plain and packed.

    python -m benchmarks.int8_linear [--tokens 2048] [--reps 10]

Writes ``benchmarks/results/int8-linear-<machine>.{json,md}``, naming the machine and its int8 instructions.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from benchmarks.common import describe, machine, machine_slug, save

SHAPES = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576)}  # (in, out)


def timed(fn, reps: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args(argv)
    from epr.lm.cpu_linear import PackedLinear, packing_supported
    from epr.lm.int8_linear import (
        FusedInt8Linear,
        Int8Linear,
        cpu_int8_flags,
        fused_supported,
        int8_supported,
        quantize_rows,
    )

    why = int8_supported()
    if why is not None:
        raise SystemExit(f"int8 is not run here: {why}")
    g = torch.Generator().manual_seed(0)
    rows, total = [], {}
    with torch.inference_mode():
        for name, (k, n) in SHAPES.items():
            w, x = torch.randn(n, k, generator=g) * 0.02, torch.randn(a.tokens, k, generator=g)
            wb, xb = w.bfloat16(), x.bfloat16()
            q8, xq = Int8Linear(w), quantize_rows(xb)[0]
            fns = {"fp32": (F.linear, x, w), "bf16": (F.linear, xb, wb), "int8": (q8, xb),
                   "int8 product alone": (torch._int_mm, xq, q8.qweight_t)}  # fmt: skip
            if fused_supported() is None:
                fns["int8 fused"] = (FusedInt8Linear(w), xb)
            if packing_supported(torch.float32):
                fns["fp32 packed"] = (PackedLinear(w), x)
            r = {"layer": name, "in": k, "out": n}
            for d, (f, *args) in fns.items():
                r[d] = timed(lambda f=f, args=args: f(*args), a.reps)
                total[d] = total.get(d, 0.0) + r[d]
            rows.append(r)
    m = machine()
    flops = {r["layer"]: 2 * a.tokens * r["in"] * r["out"] for r in rows}
    md = [f"# int8 against bf16 and fp32: SmolLM2-135M's linear layers ({describe(m)}; int8 instructions: "
          f"{', '.join(cpu_int8_flags())})", "",
          f"{a.tokens} token rows per call, mean of {a.reps} calls after a warm-up; GFLOP/s of the product (int8 "
          "includes quantising its input rows and rescaling its output).", "",
          "| layer (in -> out) | fp32 | fp32 packed | bf16 | int8 | int8 vs bf16 | int8 product alone | its vs bf16 "
          "| int8 fused (oneDNN) | its vs bf16 |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        gf = {d: flops[r["layer"]] / r[d] / 1e9 for d in total if d in r}
        md.append(f"| {r['layer']} ({r['in']} -> {r['out']}) | {gf['fp32']:.0f} | {gf.get('fp32 packed', 0):.0f} | "
                  f"{gf['bf16']:.0f} | {gf['int8']:.0f} | {r['bf16'] / r['int8']:.2f}x | "
                  f"{gf['int8 product alone']:.0f} | {r['bf16'] / r['int8 product alone']:.2f}x | "
                  f"{gf.get('int8 fused', 0):.0f} | {r['bf16'] / r.get('int8 fused', float('inf')):.2f}x |")  # fmt: skip
    fused = (
        f" oneDNN's int8 inner product with the rescale fused (epr.lm.int8_linear.FusedInt8Linear; its input "
        f"quantised per tensor in eager passes, counted): {total['bf16'] / total['int8 fused']:.2f}x bf16."
        if "int8 fused" in total
        else " (oneDNN's fused int8 product is not available here.)"
    )
    md += ["", f"All four layers: int8 {total['bf16'] / total['int8']:.2f}x bf16 ({total['fp32'] / total['int8']:.2f}x "
           f"fp32); the int8 product alone, its input already quantised: "
           f"{total['bf16'] / total['int8 product alone']:.2f}x bf16. The difference is Int8Linear's eager passes: "
           "quantising the input and, above all, rescaling the int32 output (one pass over every output element, "
           "bandwidth-bound)." + fused,
           "", f"Command: `python -m benchmarks.int8_linear --tokens {a.tokens} --reps {a.reps}`.", ""]  # fmt: skip
    raw = {
        "machine": m,
        "int8_flags": list(cpu_int8_flags()),
        "tokens": a.tokens,
        "reps": a.reps,
        "rows": rows,
    }
    save(f"int8-linear-{machine_slug(m)}", raw, "\n".join(md))
    return raw


if __name__ == "__main__":
    main()
