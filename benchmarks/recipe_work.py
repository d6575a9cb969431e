"""The work each stage of a finished run did, counted from its artifacts, and its fraction of the machine's limit.

``benchmarks.recipe`` times the stages from their manifests; this module counts what they computed, so a reader
can see how far each stage is from what the hardware allows:

- ``scores`` (label scoring), per round: the sequences scored *here* (not served by the score cache, i.e. not
  already scored by an earlier round) and their tokens. FLOPs are dense-equivalent, 2 x the LM's non-embedding
  parameters per token: prefix sharing computes each demonstration once, so the real FLOPs are fewer and the
  fraction can pass what plain batching would reach.
- ``encoder`` (training): steps x batch x (query + ``train.list_size`` demonstrations) encoder tokens, at 6 x the
  encoder's non-embedding parameters per token (forward and backward; the two towers are each that size).
- ``predict`` (generation with the gold pass read off the same prefill): prompt + gold tokens prefilled, generated
  tokens decoded, 2 x the LM's non-embedding parameters per token. Decoding is bound by reading the weights, not
  by FLOPs, so this stage's FLOP fraction is low by nature; its bound is in ``benchmarks.generate``.
- ``select``: the held-out slice's prompts (BM25 and each learned retriever), gold pass only.

The fraction divides those FLOPs by the stage's seconds x the matmul peak of the dtype it ran in, measured in the
same process as the run (``benchmarks.common.matmul_tflops``).
"""

from __future__ import annotations

import json
from pathlib import Path

from epr.artifacts import read_jsonl


def _tokens(tok, texts: list[str], special: bool = True) -> list[int]:
    out = []
    for i in range(0, len(texts), 4096):
        enc = tok(texts[i : i + 4096], add_special_tokens=special)["input_ids"]
        out += [len(x) for x in enc]
    return out


def nonembedding_params(model) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if "embed" not in n)


def _dtype_of(manifest: dict, key: str = "dtype") -> str:
    cfg = manifest.get("config", {})
    lm = cfg.get("lm", cfg)
    return (lm.get(key) if isinstance(lm, dict) else None) or cfg.get(key) or "fp32"


def scores_work(ctx, lm_tok) -> dict[int, dict]:
    """Per round (1, 2, ...): sequences and tokens scored, and those new to the run (no earlier round scored them)."""
    from epr.lm.score_cache import pair_key
    from epr.stages.scores import scored_pairs

    seen: set[str] = set()
    out = {}
    from epr.stages.scores import chunk_rankings

    for r in ctx.rounds():
        pool, ranks = r.examples("pool"), r.rankings("candidates", "candidates.jsonl")
        _, contexts, targets, _ = scored_pairs(r.task, pool, ranks)
        # prefix sharing's room: sequences per distinct demonstration within the stage's own chunks
        chunks = chunk_rankings(r, ranks, r.cfg.scoring.chunk_size)
        distinct = sum(len({c for q in ch for c in q.ids}) for ch in chunks)
        keys = [pair_key(c, t) for c, t in zip(contexts, targets)]
        new = [i for i, k in enumerate(keys) if k not in seen]
        seen.update(keys)
        lens = _tokens(lm_tok, [contexts[i] for i in new])
        lens = [a + b for a, b in zip(lens, _tokens(lm_tok, [targets[i] for i in new], special=False))]
        out[r.round] = {
            "sequences": len(keys),
            "new_sequences": len(new),
            "new_tokens": int(sum(lens)),
            "per_demo": len(keys) / max(distinct, 1),
        }
    return out


def encoder_work(ctx, enc_tok, manifest: dict) -> dict:
    """Training tokens: steps x batch x (query + list_size demonstrations), at mean encoder lengths (truncated at
    ``train.max_length``) of the labelled queries and their candidates."""
    from epr.encoder.data import demo_text

    t = ctx.cfg.train
    pool = ctx.examples("pool")
    labels = list(read_jsonl(ctx.stage_dir("labels") / "labels.jsonl"))
    q = _tokens(enc_tok, [pool[r["qid"]].input for r in labels])
    cands = sorted({c for r in labels for c in r.get("cands", r.get("pos", []) + r.get("neg", []))})
    d = _tokens(enc_tok, [demo_text(ctx.task, pool[c], t.demo_fields) for c in cands])
    qm = sum(min(x, t.max_length) for x in q) / max(len(q), 1)
    dm = sum(min(x, t.max_length) for x in d) / max(len(d), 1)
    steps = manifest.get("steps_run", manifest.get("rows", {}).get("steps", 0))
    per_instance = qm + (t.list_size if t.loss in ("listwise", "distill") else 2) * dm
    return {
        "steps": steps,
        "tokens": int(steps * t.batch_size * per_instance),
        "query_len": qm,
        "demo_len": dm,
    }


def predict_work(stage_dir: Path, prompts_dir: Path, task, lm_tok, eval_examples: dict) -> dict:
    """Prompt + gold tokens prefilled and generated tokens, over every retriever's rows."""
    prefill = gen = rows = 0
    for f in sorted(prompts_dir.glob("*.jsonl")):
        prompts = {r["idx"]: r for r in read_jsonl(f)}
        preds = list(read_jsonl(stage_dir / f.name)) if (stage_dir / f.name).exists() else []
        if not preds:
            continue
        golds = _tokens(
            lm_tok, [task.format_target(eval_examples[r["idx"]].output) for r in preds], special=False
        )
        made = _tokens(lm_tok, [r.get("prediction") or "" for r in preds], special=False)
        prefill += sum(prompts[r["idx"]]["n_tokens"] for r in preds) + sum(golds)
        gen += sum(m + 1 for m in made)  # + the stop token
        rows += len(preds)
    return {"rows": rows, "prefill_tokens": prefill, "generated_tokens": gen, "tokens": prefill + gen}


def fraction(flops: float, seconds: float, peak_tflops: float) -> float | None:
    return flops / (seconds * peak_tflops * 1e12) if seconds > 0 and peak_tflops > 0 else None


def run_work(cfg, rows: list[dict], peaks: dict[str, float]) -> None:
    """Adds ``flops``, ``tokens`` and ``fraction`` (of the matmul peak of the stage's dtype) to the rows of
    ``benchmarks.recipe.stage_rows`` in place, for the stages this module counts."""
    from transformers import AutoModel, AutoTokenizer

    from epr.context import Context
    from epr.lm.models import load_lm, resolve_encoder
    from epr.stages.retrieve import eval_examples

    ctx = Context(cfg)
    lm, lm_tok = load_lm(cfg.models.lm, dtype="fp32")
    p_lm = nonembedding_params(lm)
    del lm
    enc_path = resolve_encoder(cfg.models.encoder)
    enc_tok = AutoTokenizer.from_pretrained(enc_path)
    p_enc = nonembedding_params(AutoModel.from_pretrained(enc_path))
    by_round = {r.round: r for r in ctx.rounds()}
    scored = scores_work(ctx, lm_tok)
    for row in rows:
        name = row["stage"]
        rnd = int(name.split("/")[0].split("-")[1]) if name.startswith("round-") else ctx.round
        stage = name.split("/")[-1]
        here = by_round.get(rnd, ctx)
        man = row.get("manifest", {})
        if stage == "scores":
            w = scored[rnd]
            here_n = row["work"].get("scored_here")  # fewer where a score import served the run
            n = w["new_sequences"] if here_n is None else min(here_n, w["new_sequences"])
            tokens = round(w["new_tokens"] * n / max(w["new_sequences"], 1))
            row["tokens"], row["flops"] = tokens, 2.0 * p_lm * tokens
            row["work"]["new_sequences"] = w["new_sequences"]
            row["work"]["sequences_per_demo_in_chunk"] = round(w["per_demo"], 2)
            row["dtype"] = _dtype_of(man)
        elif stage == "encoder":
            w = encoder_work(here, enc_tok, man)
            row["tokens"], row["flops"] = w["tokens"], 6.0 * p_enc * w["tokens"]
            row["dtype"] = (
                "bf16" if man.get("config", {}).get("train", {}).get("mixed_precision") == "bf16" else "fp32"
            )
        elif stage == "predict":
            d = Path(row["dir"])
            ev = {e.idx: e for e in eval_examples(here)}
            w = predict_work(d, d.parent / "prompts", here.task, lm_tok, ev)
            row["tokens"], row["flops"] = w["tokens"], 2.0 * p_lm * w["tokens"]
            row["work"].update(prefill_tokens=w["prefill_tokens"], generated_tokens=w["generated_tokens"])
            row["dtype"] = _dtype_of(man)
        else:
            continue
        row["fraction"] = fraction(row["flops"], row["seconds"], peaks.get(row["dtype"], 0.0))
    for row in rows:
        row.pop("manifest", None)


# Other machines, estimated (not measured) from a run on a Zen 4 (the "here" files are that machine's): each stage's time here x (its kind's time there / time here), the
# ratios read off committed benchmark runs of both machines (``benchmarks/results``). ``lm`` is LM prefill work
# (label scoring, select's gold pass): the scoring benchmark's batched rate, or the matmul peak of the dtype each
# machine runs (bf16 where it has it, else fp32) where no scoring benchmark of it is committed; ``predict`` the lean
# decoder's time on the same prompts; ``encoder`` (bf16 training: no bf16 training benchmark of another machine is
# committed) the scoring benchmark's bf16 rate, as ``lm``, or the matmul peak where that is all there is.
# Each source: (file there, path, file here, path, "time" | "rate").
ESTIMATES: dict[str, dict[str, tuple]] = {
    "AMD EPYC Zen 5, 2 cores (AVX512-BF16)": {
        "lm": ("scoring-zen5.json", "ours_tok_s", "scoring-zen4.json", "ours_tok_s", "rate"),
        # Zen 5's lean decoder was measured in fp32 only: its bf16 time would be lower (a conservative estimate)
        "predict": (
            "generate-zen5.json",
            "runs.lean-fp32.seconds",
            "generate-zen4.json",
            "runs.lean-bf16.seconds",
            "time",
        ),
        "encoder": ("scoring-zen5.json", "ours_tok_s", "scoring-zen4.json", "ours_tok_s", "rate"),
    },
    "Intel Xeon with AMX, 2 cores": {
        "lm": ("scoring.json", "ours_tok_s", "scoring-zen4.json", "ours_tok_s", "rate"),
        "predict": (
            "generate-xeon-amx-2core.json",
            "runs.lean-bf16.seconds",
            "generate-zen4.json",
            "runs.lean-bf16.seconds",
            "time",
        ),
        "encoder": ("scoring.json", "ours_tok_s", "scoring-zen4.json", "ours_tok_s", "rate"),
    },
    "AMD EPYC Zen 3, 2 cores (AVX2 only: fp32)": {
        "lm": (
            "generate-zen3-avx2.json",
            "runs.lean-fp32.limits.matmul_tflops",
            "scoring-zen4.json",
            "matmul_tflops.bf16",
            "rate",
        ),
        "predict": (
            "generate-zen3-avx2.json",
            "runs.lean-fp32.seconds",
            "generate-zen4.json",
            "runs.lean-bf16.seconds",
            "time",
        ),
        "encoder": (
            "generate-zen3-avx2.json",
            "runs.lean-fp32.limits.matmul_tflops",
            "scoring-zen4.json",
            "matmul_tflops.bf16",
            "rate",
        ),
    },
}
KIND = {"scores": "lm", "select": "lm", "predict": "predict", "encoder": "encoder", "retrieve": "encoder"}


def _read(results: Path, file: str, path: str) -> float:
    d = json.loads((results / file).read_text())
    for k in path.split("."):
        d = d[k]
    return float(d)


def _per_prompt(results: Path, file: str, path: str) -> float:
    """A lean-decoder run's seconds per prompt (the runs differ in prompt count)."""
    run = path.rsplit(".", 1)[0]
    return _read(results, file, path) / _read(results, file, run + ".n")


def factors(results: Path, sources: dict[str, tuple]) -> dict[str, float]:
    """Time there / time here, per stage kind."""
    out = {}
    for kind, (f_there, p_there, f_here, p_here, how) in sources.items():
        if how == "time":
            out[kind] = _per_prompt(results, f_there, p_there) / _per_prompt(results, f_here, p_here)
        else:
            out[kind] = _read(results, f_here, p_here) / _read(results, f_there, p_there)
    return out


def estimate(rows: list[dict], results: Path) -> dict[str, dict]:
    """Each machine of :data:`ESTIMATES`: its factors and the run's stages' total there, in seconds (stages of no
    listed kind keep their time: they are seconds in all)."""
    out = {}
    for name, sources in ESTIMATES.items():
        f = factors(results, sources)
        total = sum(r["seconds"] * f.get(KIND.get(r["stage"].split("/")[-1], ""), 1.0) for r in rows)
        out[name] = {"factors": f, "total_s": total}
    return out


def _gpu_row(gpu: dict, **match) -> dict:
    rows = [r for r in gpu["rows"] if "seconds" in r and all(r.get(k) == v for k, v in match.items())]
    if len(rows) != 1:
        raise ValueError(f"{gpu.get('device_name')}: {len(rows)} measured rows match {match}")
    return rows[0]


def gpu_estimate(rows: list[dict], gpu: dict, encoder: str = "all-MiniLM-L6-v2") -> dict:
    """The run's LM and training stages at the rates ``benchmarks.gpu_stages`` measured on a GPU (``gpu``: its raw
    JSON), with the sizes a GPU runs by default (``epr.lm.identity.DEVICE_SIZES``). An estimate from the stages'
    counted work, not a run:

    - ``scores``: the tokens scored here / the prefix-shared scorer's tokens/s (SmolLM2-135M's shape);
    - ``encoder``: the training tokens / the bf16 training step's tokens/s (``encoder``'s shape, all-MiniLM-L6-v2
      or all-mpnet-base-v2: the run's ``models.encoder``; 64-token candidates: padded tokens there, real tokens
      here, so on the generous side);
    - ``predict``: prefill + gold tokens at the batched scorer's tokens/s, plus the generated tokens at the lean
      decoder's new tokens/s (whose runs include their own prefill: on the conservative side);
    - ``select`` (a gold pass of the held-out slice): its time here x the scorer's tokens/s here over there.

    Every other stage (BM25 mining, embedding the pool, faiss, prompts) keeps its time here: they do not run on the
    GPU's LM path, so the total is an upper side for them. Returns per-stage seconds and the total."""
    from epr.lm.identity import DEVICE_SIZES

    tokens, rows_ = DEVICE_SIZES["scoring.batch_tokens"][1], DEVICE_SIZES["generate.decode_rows"][1]
    lm = "SmolLM2-135M"
    shared = _gpu_row(gpu, stage="label scoring", model=lm, method="prefix-shared", batch_tokens=tokens)[
        "tok_s"
    ]
    batched = _gpu_row(gpu, stage="label scoring", model=lm, method="batched", batch_tokens=tokens)["tok_s"]
    decode = _gpu_row(gpu, stage="generation", model=lm, decode_rows=rows_)["new_tok_s"]
    train = _gpu_row(gpu, stage="encoder training", model=encoder, dtype="bf16", doc_len=64)["tokens_s"]
    here = [r for r in rows if r["stage"].split("/")[-1] == "scores" and r.get("tokens")]
    here_tok_s = sum(r["tokens"] for r in here) / sum(r["seconds"] for r in here) if here else None
    out = []
    for r in rows:
        kind, w = r["stage"].split("/")[-1], r.get("work", {})
        if kind == "scores" and r.get("tokens"):
            s, how = r["tokens"] / shared, "tokens / prefix-shared scorer"
        elif kind == "encoder" and r.get("tokens"):
            s, how = r["tokens"] / train, "tokens / bf16 training step"
        elif kind == "predict" and "generated_tokens" in w:
            s = w["prefill_tokens"] / batched + w["generated_tokens"] / decode
            how = "prefill / batched scorer + generated / lean decoder"
        elif kind == "select" and here_tok_s:
            s, how = r["seconds"] * here_tok_s / shared, "time here x scorer rate here / there"
        else:
            s, how = r["seconds"], "time here (not on the GPU's LM path)"
        out.append({"stage": r["stage"], "seconds_here": r["seconds"], "seconds": s, "how": how})
    return {
        "device_name": gpu["device_name"],
        "sizes": {"scoring.batch_tokens": tokens, "generate.decode_rows": rows_},
        "rates": {
            "scoring_tok_s": shared,
            "prefill_tok_s": batched,
            "decode_new_tok_s": decode,
            "training_tok_s": train,
        },  # fmt: skip
        "stages": out,
        "total_s": sum(r["seconds"] for r in out),
        "lm_and_training_s": sum(r["seconds"] for r in out if not r["how"].startswith("time here (")),
    }
