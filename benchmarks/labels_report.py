"""Report on a finished label run: time, counts, positives vs negatives for one query, BM25-vs-LM agreement.

python -m benchmarks.labels_report runs/mtop-large
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS


def main(run: str) -> None:
    run_dir = Path(run)
    man = {
        s: json.loads((run_dir / s / "manifest.json").read_text())
        for s in ("examples", "candidates", "scores", "labels")
    }
    pool = [json.loads(x) for x in (run_dir / "examples" / "pool.jsonl").read_text().splitlines()]
    scores = [json.loads(x) for x in (run_dir / "scores" / "scores.jsonl").read_text().splitlines()]
    labels = {
        r["qid"]: r for r in map(json.loads, (run_dir / "labels" / "labels.jsonl").read_text().splitlines())
    }
    rr, top1_is_bm25_top1, gaps = [], [], []
    for r in scores:
        s = np.array([x if x is not None else -np.inf for x in r["scores"]])
        lm_order = np.lexsort((np.array(r["ids"]), -s))
        rr.append(1.0 / (int(lm_order[0]) + 1))  # where the LM's best sits in the BM25 order
        top1_is_bm25_top1.append(lm_order[0] == 0)
        lab = labels[r["qid"]]
        gaps.append(np.mean(lab["pos_scores"]) - np.mean(lab["neg_scores"]))
    q = scores[0]["qid"]
    lab = labels[q]
    ex = pool[q]

    def show(ids, sc):
        return "\n".join(
            f"| {i} | `{pool[i]['input']}` | `{pool[i]['output']}` | {s:.2f} |" for i, s in zip(ids, sc)
        )

    md = (
        f"""# Label generation report: `{run_dir}`

Task `{man["examples"]["config"]["data"]["task"]}`, scoring LM `{man["scores"]["config"]["lm"]}` ({man["scores"]["config"]["dtype"]}).
{man["candidates"]["rows"]["queries"]} training examples x L={man["candidates"]["config"]["candidates"]["L"]} BM25-over-outputs
candidates = {man["scores"]["rows"]["sequences"]} scored sequences ({man["scores"]["rows"].get("too_long", 0)} too long for the context).

| stage | seconds |
|---|---|
"""
        + "\n".join(f"| {s} | {m.get('seconds', '')} |" for s, m in man.items())
        + f"""

(The scoring time includes contention: tests ran on the same 2 cores during part of it.)

- Labels: {len(labels)} queries, {man["labels"]["config"]["labels"]["k_pos"]} positives and {man["labels"]["config"]["labels"]["k_neg"]} hard negatives each.
- MRR of the LM's best candidate within the BM25 order: **{np.mean(rr):.3f}** (1.0 would mean BM25 already puts the LM's favourite first;
  the LM's favourite is BM25's first candidate for {100 * np.mean(top1_is_bm25_top1):.1f}% of queries).
- Mean log-prob gap between positives and hard negatives: {np.mean(gaps):.2f} nats.

## Example: query {q}

Input `{ex["input"]}` -> `{ex["output"]}`

Positives (highest log p(y | e, x)):

| id | demo input | demo output | log p |
|---|---|---|---|
{show(lab["pos"], lab["pos_scores"])}

Hard negatives (lowest, though BM25 retrieved them):

| id | demo input | demo output | log p |
|---|---|---|---|
{show(lab["neg"], lab["neg_scores"])}
"""
    )
    name = f"labels_{run_dir.name}"
    (RESULTS / f"{name}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/mtop-large")
