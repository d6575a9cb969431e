"""Check our TruthfulQA Fix numbers against lm-evaluation-harness, question by question.

Runs lm-evaluation-harness (installed in a separate environment: ``--lm-eval``, the path of its ``lm_eval``
executable) on the local TruthfulQA v0 file (its truthfulqa_mc1 / truthfulqa_mc2 tasks with the dataset pointed at
``../shared/data/truthfulqa/truthfulqa.v0.jsonl``; no hub needed) with the same de-quantised SmolLM2 weights in fp32,
scores the same questions with our scorer (the Fix primer, ``epr.truthfulqa.sets``), and writes the per-choice
log-likelihood differences and both tools' MC1 / MC2 to ``--out`` (``lm_eval_check.{md,json}``).

    python -m venv --system-site-packages /tmp/lm-eval && /tmp/lm-eval/bin/pip install "lm-eval==0.4.*"
    python scripts/lm_eval_truthfulqa.py --lm-eval /tmp/lm-eval/bin/lm_eval --limit 100 --out results/truthfulqa/lm-eval
    # all 817 questions: --limit 0 (lm-eval scores every choice from scratch: ~10x our cost)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def task_yamls(lm_eval: Path, data: Path, out: Path) -> None:
    """Local copies of lm-eval's truthfulqa_mc1 / mc2 tasks reading ``data`` instead of the hub."""
    code = "import lm_eval, os; print(os.path.dirname(lm_eval.__file__))"
    pkg = Path(subprocess.check_output([str(lm_eval.parent / "python"), "-c", code], text=True).strip())
    tdir = pkg / "tasks" / "truthfulqa"
    out.mkdir(parents=True, exist_ok=True)
    for name in ("mc1", "mc2"):
        (out / f"truthfulqa_{name}_local.yaml").write_text(
            f"include: {tdir / f'truthfulqa_{name}.yaml'}\n"
            f"task: truthfulqa_{name}_local\n"
            "tag: []\n"
            "dataset_path: json\n"
            "dataset_name: null\n"
            f"dataset_kwargs:\n  data_files:\n    validation: {data}\n"
        )


def run_lm_eval(lm_eval: Path, model_dir: str, tasks: Path, limit: int, out: Path) -> dict[str, list[dict]]:
    cmd = [str(lm_eval), "--model", "hf", "--model_args", f"pretrained={model_dir},dtype=float32",
           "--tasks", "truthfulqa_mc1_local,truthfulqa_mc2_local", "--include_path", str(tasks), "--device", "cpu",
           "--batch_size", "8", "--log_samples", "--output_path", str(out / "lm-eval-output")]  # fmt: skip
    if limit:
        cmd += ["--limit", str(limit)]
    print("$", " ".join(cmd), flush=True)
    t = time.time()
    subprocess.run(cmd, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    print(f"lm-eval took {time.time() - t:.0f} s", flush=True)
    samples = {}
    for task in ("mc1", "mc2"):
        f = sorted((out / "lm-eval-output").rglob(f"samples_truthfulqa_{task}_local_*.jsonl"))[-1]
        samples[task] = [json.loads(ln) for ln in f.read_text().splitlines() if ln.strip()]
    return samples


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--lm-eval", type=Path, required=True, help="the lm_eval executable of its own environment"
    )
    p.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    p.add_argument("--limit", type=int, default=100, help="first N questions (0: all 817)")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "truthfulqa" / "lm-eval")
    args = p.parse_args()

    from epr.lm.models import load_lm, resolve_lm
    from epr.lm.scoring import LMScorer
    from epr.reports.machine import describe, machine
    from epr.truthfulqa import sets as tqa
    from ragsys.metrics import question_metrics

    data = args.data_dir / "truthfulqa" / "truthfulqa.v0.jsonl"
    args.out.mkdir(parents=True, exist_ok=True)
    task_yamls(args.lm_eval, data.resolve(), args.out / "tasks")
    model_dir = resolve_lm("smollm2")
    samples = run_lm_eval(args.lm_eval, model_dir, args.out / "tasks", args.limit, args.out)

    rows = tqa.load_tqa(str(args.data_dir), "v0")
    n = len(samples["mc1"])
    model, tok = load_lm("smollm2", dtype="fp32")
    scorer = LMScorer(model, tok)
    t = time.time()
    ours = [tqa.score_question(scorer, rows[i], tqa.context_text([], None)) for i in range(n)]
    ours_s = time.time() - t
    diffs, per_q = [], []
    lm = {"mc1": [], "mc2": []}
    me = {"mc1": [], "mc2": []}
    for task, key in (("mc1", "mc1_targets"), ("mc2", "mc2_targets")):
        for s in sorted(samples[task], key=lambda x: x["doc_id"]):
            i = s["doc_id"]
            theirs = [float(r[0]) for r in s["filtered_resps"]]
            mine = [ours[i][c] for c in rows[i][key]["choices"]]
            diffs += [abs(a - b) for a, b in zip(theirs, mine)]
            lm[task].append(float(s["acc"]))
    for i in range(n):
        r = rows[i]
        m = question_metrics([ours[i][c] for c in r["mc1_targets"]["choices"]], r["mc1_targets"]["labels"],
                             [ours[i][c] for c in r["mc2_targets"]["choices"]], r["mc2_targets"]["labels"])  # fmt: skip
        me["mc1"].append(m["mc1"])
        me["mc2"].append(m["official_mc2"])
        per_q.append({"doc_id": i, "lm_eval": {t: lm[t][i] for t in lm}, "ours": {t: me[t][i] for t in me}})
    d = np.asarray(diffs)
    res = {
        "machine": describe(machine()),
        "questions": n,
        "choices": int(d.size),
        "loglik_abs_diff": {
            "max": float(d.max()),
            "mean": float(d.mean()),
            "p99": float(np.quantile(d, 0.99)),
        },
        "mc1": {"lm_eval": float(np.mean(lm["mc1"])), "ours": float(np.mean(me["mc1"]))},
        "mc2": {"lm_eval": float(np.mean(lm["mc2"])), "ours": float(np.mean(me["mc2"]))},
        "mc1_questions_differing": int(sum(a != b for a, b in zip(lm["mc1"], me["mc1"]))),
        "mc2_max_abs_diff": float(np.max(np.abs(np.subtract(lm["mc2"], me["mc2"])))),
        "our_seconds": ours_s,
        "per_question": per_q,
    }
    (args.out / "lm_eval_check.json").write_text(json.dumps(res, indent=2) + "\n")
    md = (
        f"# TruthfulQA v0, Fix primer, SmolLM2 fp32: ours vs lm-evaluation-harness ({n} questions)\n\n"
        f"Generated by `python scripts/lm_eval_truthfulqa.py --limit {args.limit}`. Machine: {res['machine']}.\n"
        f"lm-eval tasks truthfulqa_mc1 / truthfulqa_mc2 read the same local v0 file; the same de-quantised weights.\n\n"
        "| | lm-eval | ours |\n|---|---|---|\n"
        f"| MC1 (truthfulqa_mc1 acc) | {res['mc1']['lm_eval']:.4f} | {res['mc1']['ours']:.4f} |\n"
        f"| MC2 (truthfulqa_mc2 acc = official MC2 = paper-MC3) | {res['mc2']['lm_eval']:.4f} | "
        f"{res['mc2']['ours']:.4f} |\n\n"
        f"Per choice ({res['choices']} log-likelihoods): |ours - lm-eval| max {d.max():.2e}, mean {d.mean():.2e} "
        f"nats; questions whose MC1 differs: {res['mc1_questions_differing']}; largest per-question MC2 "
        f"difference {res['mc2_max_abs_diff']:.2e}.\n"
    )
    (args.out / "lm_eval_check.md").write_text(md)
    sys.stdout.write(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
