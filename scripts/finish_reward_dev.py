"""Record a finished R0+RM run (issue 74's dev plans) as side ``r`` of its results folder, and apply the plan's rules.

    python scripts/finish_reward_dev.py RUN results/break-reward-dev

What it does, in the order the plans (``results/{break,smcalflow}-reward-dev/PLAN.md``) fix:

1. ``epr experiment record RUN FOLDER --as r``: the rows, the select slice, the run's own select report (RM's
   put-forward row: ``logprob+em`` over ``epr, hybrid, epr+rm, hybrid+rm``) and the label cost.
2. ``epr experiment reselect`` on the committed select rows: R0's served row (the default recipe's rule,
   ``logprob`` over ``epr, hybrid``) and, descriptive, ``logprob``'s choice over all four.
3. The pairs every row is read against (R0's served row S): BM25 and SBERT against S, each +rm mode against S and
   against its own first stage, epr against hybrid; the gap from BM25 to the LM-Oracle; the status, supporting.
4. The plan's two tests (RM's put-forward row against S, in gold log-prob by Wilcoxon and in the paper's metric by
   McNemar), Holm over the two, printed as JSON for the folder's README. Nothing here is hand-typed: rerun it and
   the same numbers come back, and ``epr experiment check`` recomputes every one from the rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

ALL4 = "epr,hybrid,epr+rm,hybrid+rm"


def epr(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "epr.cli", *args], check=True)


def main(run: str, folder: str) -> dict:
    from epr.experiments.check import recompute
    from epr.experiments.declaration import FILE, load
    from epr.experiments.declare import dump
    from epr.experiments.record import slices_expected
    from epr.reports.stats import holm

    out = Path(folder)
    if not (out / "rows" / "per_query-r.jsonl.gz").exists():
        epr("experiment", "record", run, folder, "--as", "r")
    rows = str(out / "rows" / "select-r.jsonl.gz")
    served_json = out / "select-r-epr-hybrid-logprob.json"
    for modes, dest in (("epr,hybrid", served_json), (ALL4, out / "select-r-all4-logprob.json")):
        epr("experiment", "reselect", rows, "--retrievers", modes, "--weigh", "logprob", "--out", str(dest))
    served = json.loads(served_json.read_text())["selected"]
    put = json.loads((out / "select-report-r.json").read_text())["selected"]
    logprob_choice = json.loads((out / "select-r-all4-logprob.json").read_text())["selected"]

    S = f"r:{served}"
    pairs = [f"r:{b} {S}" for b in ("bm25", "sbert") if b != served]
    for m in ("epr+rm", "hybrid+rm"):
        pairs.append(f"{S} r:{m}")
        if m.removesuffix("+rm") != served:
            pairs.append(f"r:{m.removesuffix('+rm')} r:{m}")
    pairs.append("r:hybrid r:epr" if served == "hybrid" else "r:epr r:hybrid")
    decl = out / FILE
    d = yaml.safe_load(decl.read_text())
    d["status"] = "supporting"
    d["extra"] = {**(d.get("extra") or {}), "pairs": pairs, "gap": {"base": "r:bm25", "top": "r:lm-oracle"}}
    decl.write_text(dump(d))
    got, problems = recompute(load(out))
    if problems:
        raise SystemExit(f"{folder}: {problems}")
    d["expected"] = slices_expected(got)
    decl.write_text(dump(d))

    if put == served:  # the plan's two tests compare S with itself
        tests = {"gold_logprob": {"gain": 0.0, "p": 1.0}, "em": {"p": 1.0}}
    else:
        row = got[f"r:{put}-vs-{S}"]
        em = got[f"r:{put}-vs-{S}:em"]
        tests = {"gold_logprob": {"gain": row["gain"], "ci": row.get("gain_ci"), "p": row["p_wilcoxon"]},
                 "em": {"a": em["em_a"], "b": em["em_b"], "p": em["p_mcnemar"]}}  # fmt: skip
    adj = holm([tests["gold_logprob"]["p"], tests["em"]["p"]])
    tests["gold_logprob"]["p_holm"], tests["em"]["p_holm"] = adj
    summary = {"served_R0": served, "put_forward_RM": put, "logprob_choice_all4": logprob_choice, "tests": tests,
               "rows": {k: {f: v.get(f) for f in ("gold_logprob", "em", "oracle_gap_captured", "oracle_gap_captured_ci")}
                        for k, v in got.items() if "-vs-" not in k}}  # fmt: skip
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main(*sys.argv[1:3])
