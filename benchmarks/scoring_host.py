"""The scores stage's host-side work per label sequence: everything but the LM's arithmetic.

On a GPU the LM scores SmolLM2-135M label sequences at ~6,000 per second (`gpu-stages-nvidia-h200.md`), but an
8,000-label run there scored ~770 per second. The host's Python work per sequence (prompts, tokenising, grouping by
demonstration, building the batches' index tensors, the score cache) runs between the GPU's batches, and at
0748136 it alone ran at ~2,000 sequences per second on one core here: a large part, perhaps most, of what the GPU
waited on (the GPU's own share was not measured there). This measures that work alone: the real scores-stage code (``epr.stages.scores.score_chunk`` with an ``LMScorer`` over the real
SmolLM2 tokenizer and prefix sharing) on MTOP's real label set and candidates (the first ``--queries`` of a
``--labels``-example set, in the stage's chunk order), with the LM's forward and head replaced by stand-ins that
return zeros of the right shapes. So the rate is the ceiling the host sets on label scoring, whatever the device.

The baseline is the code at ``--baseline`` (a git revision), run by this same command on the same machine: its
``epr`` package is exported to a temporary folder. ``--repeats`` runs of each alternate, each in its own process,
and each row reports the median run.

    python -m benchmarks.scoring_host [--labels 8000] [--queries 1024] [--chunks 32,512] [--baseline 0748136] [--repeats 3]
        [--data-dir ../shared/data] [--tag zen3-avx2]

Rows: each chunk size, with the tokenizer on one thread (``TOKENIZERS_PARALLELISM=false``, as in the tests) and on
every core (as ``scripts/gpu_runs.sh`` sets it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _label_set(data_dir: str, labels: int, queries: int, L: int):
    """(pool, rankings): MTOP's pool and BM25-over-outputs candidates of the first ``queries`` of a ``labels``-example
    set (the stage's query order: ``query_ids`` with the default ``candidates.query_seed``)."""
    from epr.config import DataConfig
    from epr.config.sections import CandidatesConfig
    from epr.stages.candidates import mine, query_ids
    from epr.tasks import get_task

    task = get_task(DataConfig(task="mtop", data_dir=data_dir))
    pool, _ = task.load()
    qids = query_ids(len(pool), labels, CandidatesConfig().query_seed)[:queries]
    return task, pool, mine(pool, qids, L, "output", "bm25s", progress=False)


def chunk_order(pool, ranks) -> list:
    """The scores stage's query order with prefix sharing (``epr.stages.scores.chunk_rankings``, written out so a
    baseline revision's ``epr`` is ordered alike): by output within nested blocks."""
    from epr.stages.scores import nested_blocks

    out = []
    for lo, hi in nested_blocks(len(ranks)):
        out += sorted(ranks[lo:hi], key=lambda r: (pool[r.qid].output, r.qid))
    return out


def _stub_lm(scorer) -> dict:
    """Replace the LM's arithmetic with zeros of the right shapes; the host's work around it stays. The head's
    stand-in does the same indexing either revision's ``_target_sums`` does (flat tensors, or lists of them).
    Returns the counter of the padded token positions the LM would have computed (``tokens``): the work a
    FLOP-bound device does, prefixes once per distinct demonstration in a batch of prefixes."""
    import numpy as np
    import torch

    hidden = scorer.model.config.hidden_size
    layers = scorer.model.config.num_hidden_layers
    count = {"tokens": 0}

    def prefix_kv(pids):
        count["tokens"] += pids.numel()
        z = torch.zeros(pids.shape[0], 1, 1, 1)
        return [(z, z)] * layers

    def forward_after(ids, start, past, pmask):
        count["tokens"] += ids.numel()
        return torch.zeros(ids.shape[0], ids.shape[1], hidden)

    def forward(ids):  # the plain path (a pair too short to split after its prefix)
        count["tokens"] += ids.numel()
        return torch.zeros(ids.shape[0], ids.shape[1], hidden)

    def target_sums(h, rows, cols, labels, *rest):
        n = (
            rest[1] if isinstance(rest[0], list) else rest[0]
        )  # (seg, n[, greedy]) at 0748136, else (n[, greedy])
        if isinstance(rows, list):
            rows, cols, labels = torch.cat(rows), torch.cat(cols), torch.cat(labels)
        h[rows, cols]
        return np.zeros(n), None

    scorer.backbone.prefix_kv = prefix_kv
    scorer.backbone.forward_after = forward_after
    scorer.backbone.forward = forward
    scorer._target_sums = target_sums
    return count


def measure(a) -> list[dict]:
    """This process's ``epr``: sequences per second of host work at each chunk size and tokenizer threading."""
    from epr.cache import ChunkStore
    from epr.lm.models import load_lm
    from epr.lm.score_cache import ScoreCache
    from epr.lm.scoring import LMScorer
    from epr.stages.scores import score_chunk, scored_pairs

    task, pool, ranks = _label_set(a.data_dir, a.labels, a.queries, a.L)
    model, tok = load_lm("smollm2", dtype="fp32")
    scorer = LMScorer(model, tok, batch_tokens=a.batch_tokens, prefix_share=True)
    count = _stub_lm(scorer)
    order = chunk_order(pool, ranks)
    # the tokens of every pair, unshared and unpadded: what the LM computes per sequence without sharing
    seq_tokens = sum(len(c) + len(t) for c, t in scorer.encode(*scored_pairs(task, pool, order)[1:3]))
    out = []
    for threads in ("false", "true"):
        os.environ["TOKENIZERS_PARALLELISM"] = threads
        for cs in a.chunks:
            chunks = [order[i : i + cs] for i in range(0, len(order), cs)]
            with tempfile.TemporaryDirectory() as tmp:
                cache = ScoreCache(Path(tmp) / "cache", {"benchmark": cs})
                parts = ChunkStore(Path(tmp) / "parts", {"benchmark": cs}, claim=True)
                score_chunk(scorer, task, pool, chunks[0][:2], None)  # warm-up
                timing: dict[str, float] = {}
                count["tokens"] = 0
                t0, n = time.perf_counter(), 0
                for c, ch in enumerate(chunks):
                    rows, _ = score_chunk(scorer, task, pool, ch, cache, name=f"b{c}", timing=timing)
                    parts.put(c, rows, [r.to_json() for r in ch])
                    n += sum(len(r.ids) for r in ch)
                secs = time.perf_counter() - t0
            out.append(
                {
                    "chunk_size": cs,
                    "tokenizer_threads": "every core" if threads == "true" else "one thread",
                    "sequences": n,
                    "seconds": round(secs, 3),
                    "sequences_per_s": round(n / secs, 1),
                    "seconds_by_part": {k: round(v, 3) for k, v in timing.items()},
                    "lm_tokens": count["tokens"],
                    "sequence_tokens": seq_tokens,
                }
            )
            print(json.dumps(out[-1]), file=sys.stderr, flush=True)
    return out


def _worker(a, src: Path, res: Path) -> list[dict]:
    """:func:`measure` in a subprocess whose ``epr`` is the one under ``src`` (and whose ``benchmarks`` is this one)."""
    argv = [sys.executable, "-m", "benchmarks.scoring_host", "--worker", str(res), "--labels", str(a.labels)]
    argv += ["--queries", str(a.queries), "--L", str(a.L), "--batch-tokens", str(a.batch_tokens)]
    argv += ["--chunks", ",".join(map(str, a.chunks)), "--data-dir", str(Path(a.data_dir).resolve())]
    subprocess.run(
        argv,
        cwd=src,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")])),
        },
        check=True,
    )
    return json.loads(res.read_text())


def _median(runs: list[list[dict]]) -> list[dict]:
    """Row by row, the run with the median rate (its parts too), and every run's rate."""
    out = []
    for rows in zip(*runs):
        rows = sorted(rows, key=lambda r: r["sequences_per_s"])
        out.append({**rows[len(rows) // 2], "all_sequences_per_s": [r["sequences_per_s"] for r in rows]})
    return out


def interleaved(a) -> tuple[list[dict], list[dict]]:
    """``--repeats`` runs of this checkout's code and of ``--baseline``'s, alternating (so a slower spell of the
    machine hits both), each in its own process; the median run of each row."""
    ours, base = [], []
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "baseline"
        if a.baseline:
            old.mkdir()
            arch = subprocess.run(
                ["git", "archive", a.baseline, "epr"], cwd=ROOT, check=True, capture_output=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(old)], input=arch, check=True)
            shutil.copytree(ROOT / "benchmarks", old / "benchmarks")
        for i in range(a.repeats):
            ours.append(_worker(a, ROOT, Path(tmp) / f"ours-{i}.json"))
            if a.baseline:
                base.append(_worker(a, old, Path(tmp) / f"base-{i}.json"))
    return _median(ours), _median(base) if base else []


def main() -> None:
    from benchmarks.common import describe, machine, save

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--labels", type=int, default=8000, help="the label set the queries are the first of")
    ap.add_argument("--queries", type=int, default=1024, help="training examples measured (x L sequences)")
    ap.add_argument("--L", type=int, default=16)
    ap.add_argument("--batch-tokens", type=int, default=16384, help="the GPU's scoring.batch_tokens")
    ap.add_argument("--chunks", default="32,512", help="scoring.chunk_size values (comma-separated)")
    ap.add_argument(
        "--baseline", default="", help="git revision whose epr package is measured as the baseline"
    )
    ap.add_argument(
        "--repeats", type=int, default=3, help="runs of each, alternating; the median is reported"
    )
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--tag", default="")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.chunks = [int(x) for x in a.chunks.split(",")]
    if a.worker:
        Path(a.worker).write_text(json.dumps(measure(a)))
        return
    t0 = time.time()
    ours, base = interleaved(a)
    raw = {
        "machine": machine(),
        "args": {k: v for k, v in vars(a).items() if k != "worker"},
        "ours": ours,
        "baseline": base,
        "wall_s": round(time.time() - t0, 1),
    }
    head = "| chunk_size | tokenizer | sequences | LM tokens / sequence tokens | ours: seq/s | ours: prepare / lm / store s |"
    rule = "|---|---|---|---|---|---|"
    if base:
        head += f" {a.baseline}: seq/s | ours / {a.baseline} |"
        rule += "---|---|"
    lines = [head, rule]
    for i, r in enumerate(ours):
        p = r["seconds_by_part"]
        line = (
            f"| {r['chunk_size']} | {r['tokenizer_threads']} | {r['sequences']:,} | "
            f"{r['lm_tokens'] / r['sequence_tokens']:.3f} | "
            f"{r['sequences_per_s']:,.0f} | {p.get('prepare', 0):.2f} / {p.get('lm', 0):.2f} / {p.get('store', 0):.2f} |"
        )
        if base:
            b = base[i]
            line += f" {b['sequences_per_s']:,.0f} | {r['sequences_per_s'] / b['sequences_per_s']:.2f}x |"
        lines.append(line)
    md = f"""# Label scoring's host-side work (everything but the LM's arithmetic)

Machine: {describe(raw["machine"])}. MTOP, the first {a.queries:,} training
examples of a label set of {a.labels:,} x L = {a.L} BM25-over-outputs candidates, in the scores stage's chunk
order; SmolLM2's tokenizer, prefix sharing, batch_tokens {a.batch_tokens}; the LM's forward and head replaced by
stand-ins. {"Baseline: the `epr` package of " + a.baseline + ", measured by the same command in the same run." if base else ""}
Each row: the median of {a.repeats} runs{", ours and the baseline's alternating" if base else ""}, each in its own process (every run's rate: the JSON).
Wall time {raw["wall_s"]:.0f} s.

{chr(10).join(lines)}

LM tokens / sequence tokens: the padded token positions the LM computes (each distinct demonstration once per
batch of prefixes, then every suffix), over the tokens of all pairs unshared and unpadded: the work a FLOP-bound
device (a CPU) does per sequence, against plain scoring without padding (1.0).
`lm` is the scorer's host work around the stand-ins (grouping by demonstration, tokenising the demonstrations,
building index tensors); `prepare` the prompts, cache lookups and tokenising of the pairs; `store` the score cache.
A device that scores R sequences per second of LM work can go no faster than 1 / (1 / R + 1 / host rate) while the
two run one after the other.

Command: `python -m benchmarks.scoring_host --labels {a.labels} --queries {a.queries} --chunks {",".join(map(str, a.chunks))} --repeats {a.repeats}{" --baseline " + a.baseline if base else ""}{" --tag " + a.tag if a.tag else ""}`
"""
    save(f"scoring-host-{a.tag}" if a.tag else "scoring-host", raw, md)


if __name__ == "__main__":
    main()
