"""Throughput of the pipeline's three GPU stages on one GPU, against the GPU's bf16 matmul peak measured in the run.

On the lent GPU machine (H100 / H200, no internet: every model is built from its config with random weights, which do
not change the time), from the repository root; ~3 minutes on an H200 (167 s on 2026-11-27:
benchmarks/results/gpu-stages-nvidia-h200.md), measurements start only within ``--time-limit`` (420 s):

    python3 -m benchmarks.gpu_stages 2>&1 | tee benchmarks/results/raw/gpu-stages.log

Through the device tool only ``$OUT`` comes back: ``python3 -m benchmarks.gpu_stages --out $OUT 2>&1 | tee
$OUT/gpu-stages.log``, then copy the ``.json`` / ``.md`` to ``benchmarks/results/``, the log to ``.../raw/``. The
machine's transformers may differ from this project's: carry the project's as a wheel (``pip install --target``, on
``PYTHONPATH``), as the committed run did. A sweep beside the plan: ``--sections scoring,generation --batch-tokens
16384,65536 --decode-rows 256,1024 --prompts 1024 --tag sweep`` (its own result files).
Is the scorer bound by kernel launches (issue 77)? The check prepared for a lent GPU, ~2 minutes: ``--sections scoring
--batch-tokens 4096,16384,65536 --profile --tag profile --out $OUT`` traces one run of each setting (the device's busy
fraction, kernel launches per sequence, the top ops). ``--quick --device cpu``: tiny shapes in seconds (tests/test_gpu_stages_quick.py). Every measurement: warm-up, then
timed runs until ``--budget`` seconds or 5 runs, the median reported, ``torch.cuda.synchronize`` around each timer;
one that fails is recorded with its error and the run goes on.

1. **Label scoring** (``epr.lm.scoring.LMScorer``, the scores stage's) with SmolLM2-135M's and Llama-3.2-1B's shapes
   in bf16 (``models.dtype: auto`` on CUDA): 256 queries x L = 16 candidates shaped as MTOP's with SmolLM2's tokenizer
   (benchmarks/results/scoring-zen5.md: ~72 tokens a sequence: a demonstration of 24-48, the query's input of 8-16,
   its output of 16-32 the target; each demonstration in ~5 sequences). Batched (``score_ids``) and prefix-shared
   (``score_prefixed``, the stage's default), ``scoring.batch_tokens`` 4096 and 16384 (a GPU's default).
2. **Generation**, the lean decoder (``epr.lm.generate.Generator``, engine ``lean``: the predict stage's): 256 prompts
   of 120-220 tokens, greedy, 100 new tokens each (no stop string nor end-of-sequence id: a random LM would stop at
   random), ``generate.decode_rows`` 64 (a CPU's default) and 256 (a GPU's).
3. **Dual-encoder training steps**: two towers of all-MiniLM-L6-v2's and of all-mpnet-base-v2's shape, the recipe's
   loss (``train.loss: distill``, cosine, 32 queries x ``list_size`` 8 candidates, the others' as in-batch negatives;
   ``epr.encoder.losses.group_loss``), backward, an AdamW step; fp32 (``train.mixed_precision: no``, the default) and
   bf16 autocast; queries padded to 32 tokens, candidates to 64 (``train.max_length``) and 128.

FLOPs: matmul FLOPs of the work done, padding excluded: 2 x non-embedding parameters per token, attention 4 x layers
x heads x head_dim per (token, key attended), 2 x hidden x vocabulary per LM-head position (scoring: the targets;
prefix-shared: each distinct prefix once). Encoder training: an estimate, 6 x non-embedding parameters x padded
tokens. Fractions are of the measured peak of the row's dtype.
"""

from __future__ import annotations

import argparse
import gc
import re
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import describe, machine, save
from benchmarks.gpu_kit import Clock, IdTokenizer, arch, build_lm, fwd_flops, ids_text, measure, profile, rate
from epr.lm.models import pick_dtype

LMS = {  # LlamaConfig fields of the two shapes (tied embeddings)
    "SmolLM2-135M": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192, rope_theta=1e5),
    "Llama-3.2-1B": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072, rope_theta=5e5),
}  # fmt: skip
ENCODERS = {  # (architecture, config fields)
    "all-MiniLM-L6-v2": ("bert", dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                      intermediate_size=1536, vocab_size=30522, max_position_embeddings=512)),
    "all-mpnet-base-v2": ("mpnet", dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                        intermediate_size=3072, vocab_size=30527, max_position_embeddings=514)),
}  # fmt: skip
TINY_LM = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=512, max_position_embeddings=512)  # fmt: skip
TINY_ENC = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=512,
                max_position_embeddings=514)  # fmt: skip
FULL = dict(peak_n=8192, queries=256, L=16, demo=(24, 48), x=(8, 16), y=(16, 32), batch_tokens=[4096, 16384],
            prompts=256, prompt_len=(120, 220), new_tokens=100, decode_rows=[64, 256], enc_batch=32, list_size=8,
            query_len=32, doc_len=[64, 128], max_reps=5)  # fmt: skip
QUICK = dict(peak_n=256, queries=6, L=4, demo=(4, 8), x=(2, 4), y=(2, 5), batch_tokens=[256], prompts=6,
             prompt_len=(8, 16), new_tokens=4, decode_rows=[4], enc_batch=4, list_size=4, query_len=8, doc_len=[16],
             max_reps=2)  # fmt: skip


def scoring_rows(model, name: str, dname: str, p: dict, clock: Clock, peak: float) -> list[dict]:
    from epr.lm.scoring import LMScorer

    rng, a, tok = np.random.default_rng(0), arch(model), IdTokenizer(model.config.vocab_size)
    demos = [ids_text(rng, a["vocab"], p["demo"]) for _ in range(max(p["L"], p["queries"] * p["L"] // 5))]
    prefixes, contexts, targets = [], [], []
    for _ in range(p["queries"]):
        x, y = ids_text(rng, a["vocab"], p["x"]), ids_text(rng, a["vocab"], p["y"])
        for c in rng.choice(len(demos), p["L"], replace=False):
            prefixes.append(demos[c])
            contexts.append(f"{demos[c]} {x}")
            targets.append(y)
    pairs = tok(contexts)["input_ids"], tok(targets, add_special_tokens=False)["input_ids"]
    pairs = list(zip(*pairs))
    pre = [len(q) for q in tok(prefixes)["input_ids"]]
    n_tok, n_tgt = sum(len(c) + len(t) for c, t in pairs), sum(len(t) for _, t in pairs)
    head = 2 * a["hidden"] * a["vocab"] * n_tgt
    distinct = {q: len(q.split()) + 1 for q in set(prefixes)}
    flops = {
        "batched": sum(fwd_flops(a, len(c) + len(t)) for c, t in pairs) + head,
        "prefix-shared": sum(fwd_flops(a, n) for n in distinct.values())
        + sum(fwd_flops(a, len(c) + len(t) - n, n) for (c, t), n in zip(pairs, pre))
        + head,
    }
    rows = []
    for bt in p["batch_tokens"]:
        sc = LMScorer(model, tok, batch_tokens=bt, prefix_share=True)
        for method, fn in (
            ("batched", lambda sc=sc: sc.score_ids(pairs)),
            ("prefix-shared", lambda sc=sc: sc.score_prefixed(prefixes, contexts, targets, pairs)),
        ):
            base = {"stage": "label scoring", "model": name, "dtype": dname, "method": method,
                    "batch_tokens": bt, "sequences": len(pairs), "tokens": n_tok,
                    "distinct_prefixes": len(distinct), "setting": f"{method}, batch_tokens {bt}, {dname}"}  # fmt: skip
            fl = flops[method]
            measure(rows, base, clock, fn, lambda s, fl=fl: {
                "tok_s": n_tok / s, "seq_s": len(pairs) / s, "tflops": fl / s / 1e12,
                "of_peak": fl / s / 1e12 / peak, "flops": fl})  # fmt: skip
            if p.get("profile") and "seconds" in rows[-1]:
                rows[-1]["profile"] = profile(fn, clock)
    return rows


def generation_rows(model, name: str, dname: str, p: dict, clock: Clock, peak: float) -> list[dict]:
    from epr.lm.generate import Generator

    rng, a, tok = np.random.default_rng(1), arch(model), IdTokenizer(model.config.vocab_size)
    prompts = tok([ids_text(rng, a["vocab"], p["prompt_len"]) for _ in range(p["prompts"])])["input_ids"]
    head = 2 * a["hidden"] * a["vocab"]
    rows = []
    for R in p["decode_rows"]:
        gen = Generator(model, tok, p["new_tokens"], stop=None, engine="lean", decode_rows=R)
        out: dict = {}

        def run(gen=gen, out=out):
            gen.lean.stats = dict.fromkeys(gen.lean.stats, 0)  # the last run's counts
            out["ids"] = gen.lean.generate_ids(prompts)

        def metrics(sec, gen=gen, out=out):
            G = [len(g) for g in out["ids"]]
            fl = sum(fwd_flops(a, len(q)) + head for q in prompts)  # prefill and each prompt's first token
            fl += sum(fwd_flops(a, 1, len(q) + t) + head for q, g in zip(prompts, G) for t in range(g - 1))
            st, new = gen.lean.stats, sum(G)
            return {"new_tokens": new, "new_tok_s": new / sec, "prompts_s": len(prompts) / sec,
                    "prompt_tokens": st["prompt_tokens"], "decode_steps": st["decode_steps"],
                    "rows_per_step": st["decode_rows"] / max(st["decode_steps"], 1),
                    "weight_read_gbps": st["decode_steps"] * a["param_bytes"] / sec / 1e9,
                    "tflops": fl / sec / 1e12, "of_peak": fl / sec / 1e12 / peak, "flops": fl}  # fmt: skip

        base = {"stage": "generation", "model": name, "dtype": dname, "decode_rows": R, "prompts": len(prompts),
                "max_new_tokens": p["new_tokens"], "setting": f"lean decoder, decode_rows {R}, {dname}"}  # fmt: skip
        measure(rows, base, clock, run, metrics)
    return rows


def build_encoder(kind: str, spec: dict, device: str):
    from transformers import BertConfig, BertModel, MPNetConfig, MPNetModel

    config, cls = (BertConfig, BertModel) if kind == "bert" else (MPNetConfig, MPNetModel)
    with torch.device(device):
        return cls(config(**spec))


def encoder_rows(
    name: str, kind: str, spec: dict, device: str, p: dict, clock: Clock, peaks: dict, loss: str
):
    from epr.config import TrainConfig, train_loss_weight, train_temperature
    from epr.encoder.losses import group_loss
    from epr.encoder.model import DualEncoder

    tc = TrainConfig(loss=loss, list_size=p["list_size"])
    G, B = (2 if tc.loss == "epr" else tc.list_size), p["enc_batch"]
    torch.manual_seed(0)
    model = DualEncoder(build_encoder(kind, spec, device), build_encoder(kind, spec, device), None,
                        similarity=tc.similarity).train()  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr)
    N = sum(p_.numel() for n, p_ in model.q_model.named_parameters() if "embed" not in n)
    gen = torch.Generator().manual_seed(0)
    teacher = torch.randn(B, G, generator=gen).sort(1, descending=True).values.to(device)
    valid, doc_ids = torch.ones(B, G, dtype=torch.bool, device=device), torch.arange(B * G, device=device)

    def batch(n: int, length: int) -> dict:
        lens = torch.randint(length // 2, length + 1, (n,), generator=gen)
        lens[0] = length
        mask = (torch.arange(length)[None] < lens[:, None]).long()
        ids = torch.randint(3, spec["vocab_size"], (n, length), generator=gen) * mask
        return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}

    rows, dt = [], torch.device(device).type
    for length in p["doc_len"]:
        qb, db = batch(B, min(p["query_len"], length)), batch(B * G, length)
        tokens = qb["input_ids"].numel() + db["input_ids"].numel()
        for dname in ("fp32", "bf16"):

            def step(dname=dname, qb=qb, db=db):
                with torch.autocast(dt, dtype=torch.bfloat16, enabled=dname == "bf16"):
                    q, d = model(qb, "query"), model(db, "prompt")
                    lv = group_loss(tc.loss, q, d, G, temperature=train_temperature(tc), teacher=teacher,
                                    valid=valid, doc_ids=doc_ids, weight=train_loss_weight(tc),
                                    teacher_temperature=tc.teacher_temperature)  # fmt: skip
                lv.backward()
                opt.step()
                opt.zero_grad()
                return lv.item()  # the training loop reads each step's loss

            base = {"stage": "encoder training", "model": name, "dtype": dname, "loss": tc.loss, "batch": B,
                    "group": G, "query_len": qb["input_ids"].shape[1], "doc_len": length, "padded_tokens": tokens,
                    "setting": f"{tc.loss}, {B} x {G} candidates, {length} tokens, {dname}"}  # fmt: skip
            tf = 6 * N * tokens / 1e12
            measure(rows, base, clock, step, lambda s, tf=tf, dname=dname, tokens=tokens: {
                "steps_s": 1 / s, "tokens_s": tokens / s, "tflops_est": tf / s,
                "of_peak": tf / s / peaks[dname]}, warmup=2)  # fmt: skip
    return rows


def num(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def table(raw: dict) -> str:
    pk, quick = raw["peak_tflops"], " (QUICK: tiny shapes, not a measurement)" if raw["quick"] else ""
    lines = [
        f"# The GPU stages' throughput on {raw['device_name']}{quick}",
        "",
        f"Machine: {describe(raw['machine'])}. Measured in the same run: matmul peak {num(pk['bf16'])} TFLOP/s bf16, "
        f"{num(pk['fp32'])} fp32 ({raw['peak_n']}^3, random data); copy bandwidth {num(raw['copy_gbps'])} GB/s "
        f"(read + write). Random-init models of each shape. Wall time {raw['wall_s']:.0f} s.",
        "",
        "| stage | model | setting | work | s per run | throughput | TFLOP/s | of peak |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in raw["rows"]:
        head = f"| {r['stage']} | {r['model']} | {r['setting']} |"
        if "seconds" not in r:
            lines.append(f"{head} | | {r.get('error') or r.get('skipped')} | | |")
            continue
        if r["stage"] == "label scoring":
            work = f"{r['sequences']} seq, {r['tokens']} tok"
            thr = f"{r['tok_s']:,.0f} tok/s, {r['seq_s']:,.0f} seq/s"
            tf = num(r["tflops"])
        elif r["stage"] == "generation":
            work = f"{r['prompts']} prompts, {r['new_tokens']} new tok, {r['decode_steps']} steps"
            thr = f"{r['new_tok_s']:,.0f} new tok/s ({r['rows_per_step']:.0f} rows/step, {num(r['weight_read_gbps'])} GB/s of weights)"
            tf = num(r["tflops"])
        else:
            work = f"{r['batch']} q + {r['batch'] * r['group']} docs, {r['padded_tokens']} padded tok"
            thr = f"{num(r['steps_s'])} steps/s"
            tf = f"~{num(r['tflops_est'])} (est.)"
        lines.append(f"{head} {work} | {r['seconds']:.3f} | {thr} | {tf} | {r['of_peak']:.2f} of {r['dtype']} |")  # fmt: skip
    traced = [r for r in raw["rows"] if "profile" in r]
    if traced:
        lines += ["", "**Traced** (`--profile`: one run of each scoring setting under torch.profiler; busy: the "
                  "device's own op time over the run's wall time):", "",
                  "| model | setting | wall (s) | device busy (s) | busy fraction | kernel launches | launches / seq | top ops by own time |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in traced:
            pr = r["profile"]
            n = pr["launches"]
            per = f"{n / r['sequences']:.1f}" if n else ""
            ops = "; ".join(f"{o['op']} {o['own_s']:.3f}s x{o['count']}" for o in pr["top"][:5])
            lines.append(f"| {r['model']} | {r['setting']} | {pr['wall_s']:.3f} | {pr['busy_s']:.3f} | "
                         f"{pr['busy_fraction']:.2f} | {n if n is not None else ''} | {per} | {ops} |")  # fmt: skip
    return "\n".join([*lines, "", "Shapes, FLOP counts, timing: `python -m benchmarks.gpu_stages --help`.", ""])  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="tiny shapes, few repetitions (seconds on a CPU)")
    ap.add_argument("--out", default=None, help="result folder (default benchmarks/results)")
    ap.add_argument("--budget", type=float, default=None, help="timed seconds per measurement (8)")
    ap.add_argument("--time-limit", type=float, default=420.0, help="no measurement starts after it (s)")
    ap.add_argument("--sections", default="scoring,generation,encoder")
    ap.add_argument("--loss", default="distill", choices=["epr", "listwise", "distill"])
    ap.add_argument("--models", default=",".join(LMS), help="LM shapes to time (scoring, generation)")
    ap.add_argument("--batch-tokens", default=None, help="scoring.batch_tokens values, comma-separated")
    ap.add_argument("--decode-rows", default=None, help="generate.decode_rows values, comma-separated")
    ap.add_argument(
        "--tag", default="", help="appended to the result files' name (a sweep beside the default run)"
    )
    ap.add_argument("--prompts", type=int, default=None, help="prompts generated from (256)")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also trace one run of each scoring setting (torch.profiler): device busy fraction, kernel launches, "
        "top ops (issue 77: is the GPU scorer bound by launches?)",
    )
    a = ap.parse_args(argv)
    p, sections = dict(QUICK if a.quick else FULL), a.sections.split(",")
    p["profile"] = a.profile
    for key, val in (("batch_tokens", a.batch_tokens), ("decode_rows", a.decode_rows)):
        if val:
            p[key] = [int(v) for v in val.split(",")]
    if a.prompts:
        p["prompts"] = a.prompts
    clock = Clock(a.device, a.budget if a.budget is not None else (0.05 if a.quick else 8.0), p["max_reps"],
                  a.time_limit)  # fmt: skip
    cuda = a.device.startswith("cuda")
    dev_name = torch.cuda.get_device_name(torch.device(a.device)) if cuda else "cpu"
    lm_dtype = pick_dtype("auto", a.device)
    dname = "bf16" if lm_dtype == torch.bfloat16 else "fp32"
    sec = 0.2 if a.quick else 1.5
    peaks, n = {}, p["peak_n"]
    for d, t in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        x, y = (torch.randn(n, n, device=a.device).to(t) for _ in range(2))
        peaks[d] = rate(lambda x=x, y=y: x @ y, 2 * n**3 / 1e12, clock, sec)
    x = torch.empty((16 if a.quick else 1024) * 2**18, device=a.device)  # fp32: 16 MiB / 1 GiB
    y = torch.empty_like(x)
    gbps = rate(lambda x=x, y=y: y.copy_(x), 8 * x.numel() / 1e9, clock, sec)  # bytes read + written
    del x, y
    print(f"{dev_name}: matmul peak {num(peaks['bf16'])} TFLOP/s bf16, {num(peaks['fp32'])} fp32; copy {num(gbps)} GB/s", flush=True)  # fmt: skip
    rows: list[dict] = []
    for name, spec in LMS.items():
        if not {"scoring", "generation"} & set(sections):
            break
        if name not in a.models.split(","):
            continue
        model = build_lm(TINY_LM if a.quick else spec, a.device, lm_dtype)
        if "scoring" in sections:
            rows += scoring_rows(model, name, dname, p, clock, peaks[dname])
        if "generation" in sections:
            rows += generation_rows(model, name, dname, p, clock, peaks[dname])
        del model
        gc.collect()
        torch.cuda.empty_cache() if cuda else None
    if "encoder" in sections:
        for name, (kind, spec) in ENCODERS.items():
            rows += encoder_rows(name, kind, TINY_ENC if a.quick else spec, a.device, p, clock, peaks, a.loss)
    slug = re.sub(r"[^a-z0-9]+", "-", f"{dev_name} {a.tag}".lower()).strip("-")
    raw = {"machine": machine(), "device": a.device, "device_name": dev_name, "quick": a.quick, "peak_n": p["peak_n"],
           "peak_tflops": peaks, "copy_gbps": gbps, "lm_dtype": dname, "plan": p,
           "wall_s": time.perf_counter() - clock.t0, "rows": rows}  # fmt: skip
    save(f"gpu-stages-{'quick-' if a.quick else ''}{slug}", raw, table(raw), Path(a.out) if a.out else None)
    return raw


if __name__ == "__main__":
    main()
