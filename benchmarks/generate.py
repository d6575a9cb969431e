"""Exact-match generation, engine against engine, on the same MTOP prompts in one run, with the machine's limits.

Prompts: the BM25 row of ``configs/mtop_curve.yaml`` (its seeded 1,000 validation examples, demonstrations fitted
into the prompt budget by the prompts stage's own code). Engines, each in its own process (so each one's peak
resident memory is its own), one after another:

- ``hf``: ``transformers``' greedy ``generate`` (``Generator(engine="hf")``, the predict stage before the lean
  decoder), batches of ``--hf-batch`` (the MTOP config's ``generate.batch_size``);
- ``lean``: ``epr.lm.decode.LeanDecoder`` (``Generator(engine="lean")``);
- ``serve``: ``epr serve`` (llama.cpp, the packaged Q4_1 GGUF) through ``ServerGenerator`` (optional).

The limits, measured here in the same run: the dtype's matmul peak (the faster of a 2048^3 product and the LM's
gate/up product on 4,096 rows as the model runs it) bounds the prefill (2 x body
parameters x prompt tokens, plus attention); the memory bandwidth (a sum over 1 GiB) bounds each decoding step,
which must read every weight once. ``fraction_of_limit`` = (prefill bound + decode bound) / measured seconds for the
lean decoder. Resident memory is sampled after every chunk of prompts (flat = nothing grows with the prompt count).

    python -m benchmarks.generate [--n 1000] [--dtypes fp32,bf16] [--engines hf,lean] [--tag NAME]

On a machine without the data (a lent server, say), build the prompts where the data is with
``--save-prompts FILE`` and pass ``--prompts FILE`` there: the same prompts, byte for byte.

Writes ``benchmarks/results/generate[-TAG].{json,md}`` with ``speedup_lean_vs_hf`` and ``identical_fp32``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def mtop_prompts(n: int, data_dir: str) -> tuple[list[str], list[str]]:
    """The BM25 row's prompts for the first ``n`` of the MTOP curve's seeded evaluation examples, and the gold
    outputs."""
    prompts, ev, task = mtop_examples(n, data_dir)
    return prompts, [task.normalize(e.output) for e in ev]


def mtop_examples(n: int, data_dir: str) -> tuple[list[str], list, object]:
    """The BM25 row's prompts for the first ``n`` of the MTOP curve's seeded evaluation examples, the examples and
    the task."""
    from epr.config import load_config
    from epr.context import Context
    from epr.pipeline import run_stage
    from epr.retrieval.retrievers import make_retriever
    from epr.stages.prompts import prompt_maker
    from epr.stages.retrieve import eval_examples

    cfg = load_config(
        [str(ROOT / "configs/mtop_curve.yaml")],
        [f"data.data_dir={data_dir}", f"run_root={tempfile.gettempdir()}/epr-bench-generate"],
    )
    ctx = Context(cfg)
    run_stage(ctx, "examples")
    pool, ev = ctx.examples("pool"), eval_examples(ctx)[:n]
    hits = make_retriever("bm25", pool, ctx.task, cfg).retrieve(ev, cfg.retrieve.k)
    make = prompt_maker(ctx)
    return [make(e, ids).text for e, ids in zip(ev, hits.ids)], ev, ctx.task


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def worker(
    engine: str,
    dtype: str,
    prompts_file: str,
    out_file: str,
    hf_batch: int,
    max_new: int,
    limit: int,
    chunk: int,
) -> None:
    import torch

    from epr.lm.generate import Generator
    from epr.lm.models import load_lm

    prompts = json.loads(Path(prompts_file).read_text())[: limit or None]
    rec: dict = {"engine": engine, "dtype": dtype, "rss_mb_after_chunk": [], "chunk_seconds": []}
    if engine == "serve":
        from epr.lm.llamacpp_server import launch
        from epr.lm.served import OpenAIServer, ServerGenerator

        with launch("smollm2", threads=torch.get_num_threads()) as url:
            server = OpenAIServer(url, concurrency=2)
            gen = ServerGenerator(server, "smollm2", max_new, "\n")
            gen.generate(prompts[:4])
            t = time.perf_counter()
            preds = []
            for s in range(0, len(prompts), chunk):
                preds += gen.generate(prompts[s : s + chunk])
            rec["seconds"] = time.perf_counter() - t
            server.close()
    else:
        model, tok = load_lm("smollm2", dtype=dtype)
        g = Generator(model, tok, max_new, hf_batch, "\n", engine=engine)
        g.generate(prompts[:4])  # warm-up (kernels, the stop table)
        if g.lean is not None:
            g.lean.stats = dict.fromkeys(g.lean.stats, 0)
        rec["rss_mb_loaded"] = rss_mb()
        t = time.perf_counter()
        preds = []
        for s in range(0, len(prompts), chunk):
            t0 = time.perf_counter()
            preds += g.generate(prompts[s : s + chunk])
            rec["chunk_seconds"].append(time.perf_counter() - t0)
            rec["rss_mb_after_chunk"].append(round(rss_mb(), 1))
            print(
                f"{engine} {dtype}: {len(preds)}/{len(prompts)} {time.perf_counter() - t:.0f} s", flush=True
            )
        rec["seconds"] = time.perf_counter() - t
        if g.lean is not None:
            rec["lean_stats"] = g.lean.stats
        rec["prompt_tokens"] = sum(len(tok(p)["input_ids"]) for p in prompts)
        rec["generated_tokens"] = sum(len(tok(y)["input_ids"]) + 1 for y in preds)  # + the stop token
    rec["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rec["predictions"] = preds
    Path(out_file).write_text(json.dumps(rec))


def memory_gbps(gib: float = 1.0, reps: int = 5) -> float:
    """Read bandwidth: the best of ``reps`` sums over a ``gib`` GiB fp32 tensor."""
    import torch

    x = torch.ones(int(gib * 2**30 / 4))
    x.sum()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best / 1e9


def linear_tflops(dt, k: int, n: int, m: int = 4096, reps: int = 5) -> float:
    """The LM's largest prefill product (``m`` rows through the fused gate/up weight) as the model runs it
    (``epr.lm.cpu_linear.linear_fn``: oneDNN-packed in fp32)."""
    import torch

    from epr.lm.cpu_linear import linear_fn

    f = linear_fn(torch.randn(n, k).to(dt))
    x = torch.randn(m, k).to(dt)
    with torch.inference_mode():
        f(x)
        t = time.perf_counter()
        for _ in range(reps):
            f(x)
    return 2 * m * k * n * reps / (time.perf_counter() - t) / 1e12


def decode_bound(peak: float, bw: float, params: int, el: int, stats: dict) -> tuple[float, float]:
    """Seconds decoding cannot beat: each step reads every weight once (``el`` bytes each at ``bw`` B/s), and every
    row of it costs 2 x ``params`` FLOPs at ``peak`` FLOP/s; the larger total bounds it. Returns (read, FLOPs)."""
    return stats["decode_steps"] * params * el / bw, stats["decode_rows"] * 2 * params / peak


def limits(dtype: str, stats: dict) -> dict:
    """Lower bounds on the lean decoder's time from the measured peak and bandwidth."""
    import torch

    from benchmarks.common import matmul_tflops
    from epr.lm.models import load_lm

    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    model, _ = load_lm("smollm2", dtype=dtype, pack="off")
    c = model.config
    head = model.get_output_embeddings().weight.numel()
    body = sum(
        p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n and "lm_head" not in n
    )
    el = 2 if dt == torch.bfloat16 else 4
    peak = max(matmul_tflops(dt), linear_tflops(dt, c.hidden_size, 2 * c.intermediate_size)) * 1e12
    bw = memory_gbps() * 1e9
    T = stats["prompt_tokens"] / max(stats["prompts"], 1)
    attn = (
        2 * 2 * c.num_hidden_layers * c.hidden_size * T / 2
    )  # per token: scores + weighted sum, causal half
    prefill_s = stats["prompt_tokens"] * (2 * body + attn) / peak + stats["prompts"] * 2 * head / peak
    decode_read_s, decode_flop_s = decode_bound(peak, bw, body + head, el, stats)
    decode_s = max(decode_read_s, decode_flop_s)
    return {
        "matmul_tflops": peak / 1e12,
        "memory_gbps": bw / 1e9,
        "body_params": body,
        "head_params": head,
        "prefill_bound_s": prefill_s,
        "decode_bound_s": decode_s,
        "decode_read_bound_s": decode_read_s,
        "decode_flop_bound_s": decode_flop_s,
    }


def stored_bounds(path: str) -> str:
    """The bound and the largest possible speed-up over HF for a stored result JSON, by today's formula from its own
    measurements (peak, bandwidth, decoder counts): runs saved before the decode bound counted the rows' FLOPs."""
    d = json.loads(Path(path).read_text())
    if "runs" not in d:
        return f"{path}: no per-engine runs stored (a result of an older version of this benchmark): no bound"
    out = []
    for dt in ("fp32", "bf16"):
        lean, hf = d["runs"].get(f"lean-{dt}"), d["runs"].get(f"hf-{dt}")
        if not lean:
            continue
        lim = lean["limits"]
        el = 2 if dt == "bf16" else 4
        peak, bw = lim["matmul_tflops"] * 1e12, lim["memory_gbps"] * 1e9
        params = lim["body_params"] + lim["head_params"]
        bound = lim["prefill_bound_s"] + max(decode_bound(peak, bw, params, el, lean["lean_stats"]))
        line = f"{path} {dt}: bound {bound:.1f} s, lean {lean['seconds']:.1f} s ({bound / lean['seconds']:.2f} of it)"
        if hf:
            line += f"; at most {hf['seconds'] / hf['n'] * lean['n'] / bound:.2f}x over HF is possible"
        out.append(line)
    return "\n".join(out)


def main() -> None:
    from epr.config.sections import GenerateConfig
    from epr.lm.identity import device_size

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--engines", default="hf,lean")
    ap.add_argument("--hf-batch", type=int, default=16)
    ap.add_argument(
        "--hf-limit",
        default="",
        help="DTYPE=N,...: the HF engine runs only the first N prompts for that dtype (it is the slow one); the "
        "speed-up compares both engines on those prompts, chunk by chunk",
    )
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument(
        "--chunk",
        type=int,
        default=device_size("generate.chunk_size", GenerateConfig().chunk_size, "cpu"),
        help="prompts per generate call (default: the predict stage's generate.chunk_size on a CPU)",
    )
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared/data"))
    ap.add_argument("--tag", default="")
    ap.add_argument(
        "--prompts",
        default="",
        help="JSON {prompts, golds} written by --save-prompts: run on a machine without the data or the retrievers",
    )
    ap.add_argument(
        "--save-prompts", default="", help="write the prompts and golds to this JSON file and stop"
    )
    ap.add_argument(
        "--bounds", nargs="+", metavar="JSON", help="print the bounds of stored results (no run) and stop"
    )
    ap.add_argument("--limit", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--worker", nargs=3, metavar=("ENGINE", "DTYPE", "FILES"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.bounds:
        return print("\n".join(stored_bounds(f) for f in a.bounds))
    if a.worker:
        engine, dtype, files = a.worker
        pf, of = files.split(",")
        return worker(engine, dtype, pf, of, a.hf_batch, a.max_new_tokens, a.limit, a.chunk)

    from benchmarks.common import describe, machine, save

    if a.prompts:
        saved = json.loads(Path(a.prompts).read_text())
        prompts, golds = saved["prompts"][: a.n], saved["golds"][: a.n]
    else:
        prompts, golds = mtop_prompts(a.n, a.data_dir)
    if a.save_prompts:
        Path(a.save_prompts).write_text(json.dumps({"prompts": prompts, "golds": golds}))
        return
    tmp = Path(tempfile.mkdtemp(prefix="epr-bench-gen-"))
    pf = tmp / "prompts.json"
    pf.write_text(json.dumps(prompts))
    runs: dict[str, dict] = {}
    hf_limit = {d: int(n) for d, n in (x.split("=") for x in a.hf_limit.split(",") if x)}
    if any(n % a.chunk for n in hf_limit.values()):
        ap.error(
            f"--hf-limit {a.hf_limit}: each limit must be a multiple of --chunk {a.chunk} (compared chunk by chunk)"
        )
    for dtype in a.dtypes.split(","):
        for engine in a.engines.split(","):
            if engine == "serve" and dtype != a.dtypes.split(",")[0]:
                continue  # the server has one arithmetic (Q4_1): run it once
            of = tmp / f"{engine}-{dtype}.json"
            cmd = [sys.executable, "-m", "benchmarks.generate", "--worker", engine, dtype, f"{pf},{of}"]
            cmd += ["--hf-batch", str(a.hf_batch), "--max-new-tokens", str(a.max_new_tokens)]
            cmd += ["--chunk", str(a.chunk)]
            if engine == "hf" and dtype in hf_limit:
                cmd += ["--limit", str(hf_limit[dtype])]
            subprocess.run(cmd, check=True, cwd=ROOT)
            rec = json.loads(of.read_text())
            name = "serve" if engine == "serve" else f"{engine}-{dtype}"
            runs[name] = rec
            rec["n"] = len(rec["predictions"])
            rec["em"] = sum(" ".join(p.split()) == g for p, g in zip(rec["predictions"], golds)) / rec["n"]
            print(f"{name}: {rec['seconds']:.1f} s, {rec['n'] / rec['seconds']:.2f} prompts/s", flush=True)

    raw: dict = {"machine": machine(), "n_prompts": len(prompts), "max_new_tokens": a.max_new_tokens}
    raw["hf_batch"] = a.hf_batch
    for dtype in a.dtypes.split(","):
        hf, lean = runs.get(f"hf-{dtype}"), runs.get(f"lean-{dtype}")
        if hf and lean:
            n = min(hf["n"], lean["n"])  # the same prompts: HF may have run only the first chunks
            c = len(hf["chunk_seconds"])
            same = sum(x == y for x, y in zip(hf["predictions"][:n], lean["predictions"][:n]))
            raw[f"speedup_lean_vs_hf_{dtype}"] = sum(hf["chunk_seconds"]) / sum(lean["chunk_seconds"][:c])
            raw[f"compared_prompts_{dtype}"] = n
            raw[f"same_predictions_{dtype}"] = same
            if dtype == "fp32":
                raw["identical_fp32"] = same == n
        if lean:
            lean["limits"] = limits(dtype, lean["lean_stats"])
            lim = lean["limits"]
            bound = lim["prefill_bound_s"] + lim["decode_bound_s"]
            lean["fraction_of_limit"] = bound / lean["seconds"]
            if hf:  # no engine beats the bound: HF's time for the same prompts over it caps any speed-up
                raw[f"max_speedup_vs_hf_{dtype}"] = hf["seconds"] / hf["n"] * lean["n"] / bound
    first = a.dtypes.split(",")[0]
    if f"speedup_lean_vs_hf_{first}" in raw:
        raw["speedup_lean_vs_hf"] = raw[f"speedup_lean_vs_hf_{first}"]
    raw["runs"] = runs

    rows = []
    for name, r in runs.items():
        frac = f"{r['fraction_of_limit']:.2f}" if "fraction_of_limit" in r else ""
        if (
            name == "serve"
        ):  # the server counts its own tokens and holds the model: not measured by the client
            tok_s, peak, over = "", "", "(in the server)"
        else:
            tok_s = f"{(r['prompt_tokens'] + r['generated_tokens']) / r['seconds']:.0f}"
            rss = r["rss_mb_after_chunk"]
            peak, over = f"{r['peak_rss_mb']:.0f}", f"{rss[0]:.0f} → {rss[-1]:.0f}"
        rows.append(
            f"| {name} | {r['n']} | {r['seconds']:.1f} | {r['n'] / r['seconds']:.2f} | {tok_s} | "
            f"{100 * r['em']:.1f} | {peak} | {over} | {frac} |"
        )
    lims = "\n".join(
        f"- {d}: matmul peak {runs[f'lean-{d}']['limits']['matmul_tflops']:.2f} TFLOP/s, memory "
        f"{runs[f'lean-{d}']['limits']['memory_gbps']:.1f} GB/s; lean decoder's bounds: prefill "
        f"{runs[f'lean-{d}']['limits']['prefill_bound_s']:.1f} s + decode "
        f"{runs[f'lean-{d}']['limits']['decode_bound_s']:.1f} s (the larger of reading the weights each step, "
        f"{runs[f'lean-{d}']['limits']['decode_read_bound_s']:.1f} s, and the rows' FLOPs, "
        f"{runs[f'lean-{d}']['limits']['decode_flop_bound_s']:.1f} s) "
        f"({runs[f'lean-{d}']['lean_stats']['decode_steps']} batched steps)"
        for d in a.dtypes.split(",")
        if f"lean-{d}" in runs
    )
    sp = "\n".join(
        f"- {d}: lean vs HF **{raw[f'speedup_lean_vs_hf_{d}']:.2f}x** on the same "
        f"{raw[f'compared_prompts_{d}']} prompts, same predictions "
        f"{raw[f'same_predictions_{d}']}/{raw[f'compared_prompts_{d}']}"
        + (
            f"; at most {raw[f'max_speedup_vs_hf_{d}']:.2f}x is possible here (HF's time over the lean decoder's bound)"
            if f"max_speedup_vs_hf_{d}" in raw
            else ""
        )
        for d in a.dtypes.split(",")
        if f"speedup_lean_vs_hf_{d}" in raw
    )
    md = f"""# Exact-match generation: transformers' generate vs the lean decoder (SmolLM2-135M)

Machine: {describe(raw["machine"])}. {len(prompts)} MTOP prompts (the BM25 row of `configs/mtop_curve.yaml`),
greedy, at most {a.max_new_tokens} new tokens, stop at a newline; HF batches of {a.hf_batch}; {a.chunk} prompts per
generate call. Each engine in its own process, one after another. `python -m benchmarks.generate {" ".join(sys.argv[1:])}`

| engine | prompts | seconds | prompts/s | prompt+generated tokens/s | EM | peak RSS MB | RSS over the run MB | fraction of limit |
|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

{sp}
{"- serve: `epr serve` (llama.cpp, the packaged Q4_1 weights: its own arithmetic, not fp32), one client process sending 2 requests at a time." if "serve" in runs else ""}

Limits measured in the same run:
{lims}
"""
    save("generate" + (f"-{a.tag}" if a.tag else ""), raw, md)


if __name__ == "__main__":
    main()
