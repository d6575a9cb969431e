"""``epr experiment check`` fails on what it is for: a one-number change to a committed row file, to a declaration's
expected number, to a folder's table; a declaration that names an unknown key or status; and it passes on every
committed folder (CI)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from epr.experiments import check as checking
from epr.experiments import declare, digests, gap, index
from epr.experiments.declaration import load
from epr.reports import plots
from epr.stages.select import choose_rows
from epr.types import InputError

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"


def _copy(tmp_path: Path, name: str) -> Path:
    """A committed folder copied; a curve folder gets a fresh draft declaration (title and outcome filled), so that
    the negative controls do not depend on the hand-written one."""
    dst = tmp_path / "results" / name
    shutil.copytree(RESULTS / name, dst)
    d = yaml.safe_load((dst / "experiment.yaml").read_text())
    if d["kind"] == "curve":  # a fresh draft: the controls do not lean on the hand-written fields
        d = declare.draft(dst)
    d.update(title=f"{name} (copy)", outcome="as committed", date=d.get("date") or "2026-11-26")
    (dst / "experiment.yaml").write_text(declare.dump(d))
    digests.write(dst)  # pinned as copied: the controls below test the recomputation beneath the pins
    return dst


def test_every_committed_folder_recomputes_to_what_it_declares():
    bad = {f.name: checking.check(f) for f in checking.folders(RESULTS)}
    assert len(bad) >= 40
    assert {k: v for k, v in bad.items() if v} == {}


def test_a_copied_folder_passes_then_fails_on_a_one_number_change_to_a_row_file(tmp_path):
    f = _copy(tmp_path, "mtop-curve-round2-locked")
    assert checking.check(f) == []
    row = f / "rows" / "epr@2000-distill-s1.json"
    d = json.loads(row.read_text())
    d["per_query_logprob"][7] += 1.0  # one example, one nat: the mean moves by 1/1235
    row.write_text(json.dumps(d))
    problems = checking.check(f)
    assert any("rows/epr@2000-distill-s1.json: gold_logprob" in p for p in problems), problems
    assert any("epr@2000-distill-pooled logprob_gain_vs_bm25" in p for p in problems)  # and what it feeds


def test_a_one_number_change_to_an_exact_match_row_fails(tmp_path):
    f = _copy(tmp_path, "break-curve-locked-em")
    em = f / "rows" / "em-hybrid@2000-distill.json.gz"
    d = json.loads(gzip.decompress(em.read_bytes()))
    d["metrics"]["lf_em"][0] = not d["metrics"]["lf_em"][0]
    em.write_bytes(gzip.compress(json.dumps(d).encode()))
    assert any("lf_em" in p for p in checking.check(f))


def test_a_one_number_change_to_the_declaration_fails(tmp_path):
    f = _copy(tmp_path, "smcalflow-curve-round2-locked")
    text = (f / "experiment.yaml").read_text()
    d = yaml.safe_load(text)
    e = next(x for x in d["expected"] if x["field"] == "gold_logprob" and "@" in x["row"])
    d["expected"][d["expected"].index(e)] = {**e, "value": e["value"] + 0.1}
    (f / "experiment.yaml").write_text(declare.dump(d))
    assert any(f"expected {e['row']}.gold_logprob" in p for p in checking.check(f))


def test_a_changed_table_fails_even_when_the_rows_are_intact(tmp_path):
    f = _copy(tmp_path, "mtop-default-recipe")
    raw = json.loads((f / "locked.json").read_text())
    raw["retrievers"]["bm25"]["metric"] += 0.01
    (f / "locked.json").write_text(json.dumps(raw))
    assert any("locked.json" in p for p in checking.check(f))


def test_declarations_are_checked_with_the_file_and_key_named(tmp_path):
    f = _copy(tmp_path, "mtop-curve-round1")
    d = yaml.safe_load((f / "experiment.yaml").read_text())
    for bad, match in (
        ({**d, "stauts": "decisive"}, "unknown keys \\['stauts'\\]"),
        ({**d, "status": "great"}, "status: 'great' is not one of"),
        ({**d, "status": "superseded"}, "needs superseded_by"),
        ({**d, "split": "locked", "outcome": ""}, "needs its outcome"),
        ({**d, "expected": [{"row": "bm25", "value": 1}]}, "expected\\[0\\]"),
        ({**d, "preregistration": "NOPE.md"}, "does not exist"),
        ({**d, "split": "locked", "outcome": "x", "date": "2026-11-27"}, "needs its preregistration"),
    ):
        (f / "experiment.yaml").write_text(yaml.safe_dump(bad))
        with pytest.raises(InputError, match=match) as e:
            load(f)
        assert str(f / "experiment.yaml") in str(e.value)


def test_holm_over_a_dataset_family_by_hand(tmp_path):
    a = _copy(tmp_path, "mtop-curve-round2-locked")
    b = _copy(tmp_path, "mtop-curve-round2-listwise-locked")
    exps = [load(a), load(b)]
    rows = {e.name: checking.recompute(e)[0] for e in exps}
    fam = index.family(exps, rows)
    ps = sorted(p for p, _ in fam.values())
    m = len(ps)
    assert m == sum(len(e.tests) for e in exps) >= 4
    want = []
    running = 0.0
    for i, p in enumerate(ps):
        running = max(running, min(1.0, (m - i) * p))
        want.append(running)
    assert sorted(h for _, h in fam.values()) == pytest.approx(want)


def test_the_index_is_what_the_folders_say():
    text, readmes = index.build(RESULTS)
    assert (RESULTS / "README.md").read_text() == text, "run: epr experiment index"
    for name, t in readmes.items():
        assert (RESULTS / name / "README.md").read_text() == t, f"{name}/README.md: run epr experiment index"
    assert all((f / "README.md").exists() for f in checking.folders(RESULTS))


def test_a_rerun_writes_beside_never_into_the_committed_folder():
    from epr.cli.experiment import rerun_command

    cmd = (
        "scripts/learning_curve.py --split locked --set candidates.mine_run=/w/runs/mtop-curve/2000-distill "
        "--sizes 2000 --run-root /w/runs --out out/x"
    )
    argv = rerun_command(cmd, Path("runs/rerun/x"), "fresh")[1:]  # after the interpreter
    assert argv[:4] == ["-m", "epr.cli", "experiment", "curve"]
    assert argv[-4:] == ["--out", "runs/rerun/x", "--run-root", "fresh"]
    assert "out/x" not in argv and "/w/runs" not in argv
    assert "candidates.mine_run=fresh/mtop-curve/2000-distill" in argv  # the round-1 run moves with the root
    assert rerun_command("scripts/learning_curve.py --from-rows --out results/x", Path("y"), "r") is None
    assert rerun_command("epr run -c configs/mtop.yaml", Path("y"), "r")[1:4] == ["-m", "epr.cli", "run"]
    # the results tools by the script paths older folders recorded (the scripts are gone): the same options
    old = rerun_command("python scripts/compare_rows.py a.json b.json --json", Path("y"), "r")[1:]
    assert old == ["-m", "epr.cli", "experiment", "compare-rows", "a.json", "b.json", "--json"]
    assert rerun_command("scripts/mtop_curve.py --sizes 250", Path("y"), "r")[1:5] == [
        "-m",
        "epr.cli",
        "experiment",
        "curve",
    ]


def test_index_check_fails_on_a_stale_index(tmp_path, capsys):
    from epr.cli import main

    results = tmp_path / "results"
    for name in ("mtop-curve-round1", "mtop-default-recipe"):
        shutil.copytree(RESULTS / name, results / name)
    assert main(["experiment", "index", "--results", str(results)]) == 0
    assert main(["experiment", "index", "--check", "--results", str(results)]) == 0
    readme = results / "mtop-curve-round1" / "README.md"
    readme.write_text(readme.read_text().replace("**supporting**", "**decisive**"))
    assert main(["experiment", "index", "--check", "--results", str(results)]) == 1
    assert "stale" in capsys.readouterr().out
    assert main(["experiment", "check", "--results", str(results)]) == 0


def _run_from_committed(run: Path, evaluate: str, change=None, manifest: dict | None = None) -> Path:
    """A finished run's folders rebuilt from mtop-default-recipe's committed (locked) rows, its evaluation at
    ``run/evaluate``; ``change`` rewrites each evaluation row."""
    src = RESULTS / "mtop-default-recipe"
    (run / "examples").mkdir(parents=True)
    (run / "examples" / "manifest.json").write_text(json.dumps({"config": {"data": {"task": "mtop"}}}))
    for d, name, gz in (
        (run / evaluate, "per_query.jsonl", src / "rows" / "per_query-locked.jsonl.gz"),
        (run / "select", "per_example.jsonl", src / "rows" / "select-per_example.jsonl.gz"),
    ):
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(json.dumps(manifest or {}))
        rows = [json.loads(x) for x in gzip.decompress(gz.read_bytes()).splitlines()]
        if change and name == "per_query.jsonl":
            rows = [change(r) for r in rows]
        (d / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    shutil.copy(src / "select-report.json", run / "select" / "report.json")
    return run


def test_record_remakes_a_committed_run_folder_value_for_value(tmp_path):
    """A run rebuilt from mtop-default-recipe's committed rows, recorded anew: the same table, a declaration whose
    numbers check, the hand-written fields kept."""
    from epr.experiments.record import record

    src = RESULTS / "mtop-default-recipe"
    run = _run_from_committed(tmp_path / "runs" / "mtop", "locked/evaluate")
    dest = tmp_path / "results" / "mtop-default-recipe"
    dest.mkdir(parents=True)
    shutil.copy(src / "experiment.yaml", dest / "experiment.yaml")
    shutil.copy(src / "PREREGISTRATION.md", dest / "PREREGISTRATION.md")
    with pytest.raises(InputError, match="already recorded"):  # the copied declaration holds its numbers
        record(run, dest, "locked")
    assert sorted(p.name for p in dest.iterdir()) == [
        "PREREGISTRATION.md",
        "experiment.yaml",
    ]  # nothing written
    record(run, dest, "locked", overwrite=True)
    assert json.loads((dest / "locked.json").read_text()) == json.loads((src / "locked.json").read_text())
    assert checking.check(dest) == []
    was, now = load(src), load(dest)
    assert (now.title, now.outcome, now.status) == (was.title, was.outcome, was.status)
    assert {(t.row, t.field) for t in now.tests} == {(t.row, t.field) for t in was.tests}


SLICES_DECL = {"title": "t", "dataset": "mtop", "split": "dev", "status": "diagnostic", "date": "2026-11-27",
               "kind": "slices"}  # fmt: skip


def _slices_folder(tmp_path, src: str, prefix: str):
    """The committed MTOP default-recipe rows ``rows/<src>.jsonl.gz``, an empty slices folder, and a writer of its
    ``rows/<prefix>-<variant>.jsonl.gz``."""
    path = RESULTS / "mtop-default-recipe" / "rows" / f"{src}.jsonl.gz"
    rows = [json.loads(x) for x in gzip.decompress(path.read_bytes()).splitlines()]
    folder = tmp_path / "results" / "slices"
    (folder / "rows").mkdir(parents=True)

    def put(name, rs):
        (folder / "rows" / f"{prefix}-{name}.jsonl.gz").write_bytes(
            gzip.compress("".join(json.dumps(r) + "\n" for r in rs).encode())
        )
        if (
            prefix == "select"
        ):  # record writes a select's report beside its rows, and check recomputes its choice
            report = choose_rows(rs, ["epr", "hybrid"], "logprob", 0.05, name)
            (folder / f"select-report-{name}.json").write_text(json.dumps(report))

    return rows, folder, put


def test_a_slices_folder_recomputes_its_pairs_and_fails_on_a_changed_value(tmp_path):
    """``kind: slices``: runs' selection slices (choices made on held-out pool examples), paired by ``idx``; the
    committed MTOP select slice as variant A, and B the same examples with hybrid 0.5 nats higher on each."""
    rows, folder, put = _slices_folder(tmp_path, "select-per_example", "select")

    put("a", rows)
    put("b", [{**r, "hybrid": r["hybrid"] + 0.5} for r in reversed(rows)])  # another order: paired by idx
    decl = {
        **SLICES_DECL,
        "outcome": "b is 0.5 nats above a",
        "extra": {"pairs": ["a:hybrid b:hybrid", "a:bm25 a:hybrid"]},
        "expected": [
            {"row": "b:hybrid-vs-a:hybrid", "field": "gain", "value": 0.5, "tol": 1e-9},
            {"row": "a:hybrid-vs-a:bm25", "field": "gain", "value": 1.3513003, "tol": 1e-6},
        ],
    }
    (folder / "experiment.yaml").write_text(declare.dump(decl))
    digests.write(folder)
    assert checking.check(folder) == []
    got, _ = checking.recompute(load(folder))
    assert got["b:hybrid-vs-a:hybrid"]["win_rate"] == 1.0 and got["a:hybrid"]["n"] == len(rows)
    put("b", [{**r, "hybrid": r["hybrid"] + (0.5 if i else 0.6)} for i, r in enumerate(rows)])
    assert any("b:hybrid-vs-a:hybrid.gain" in p for p in checking.check(folder))
    put("b", [{**r, "idx": r["idx"] + 1} for r in rows])  # other examples
    assert any("same examples" in p for p in checking.check(folder))


def test_the_gap_plot_draws_each_learned_point_once(tmp_path):
    """results/gap-vs-labels.png (issue 48): every decisive or supporting curve folder's learned rows with a gap,
    a several-seed point standing for its own seeds; superseded folders are not drawn."""
    every = [load(f) for f in checking.folders(RESULTS)]
    rows = {e.name: checking.recompute(e)[0] for e in every if e.kind in ("curve", "slices")}
    exps = [e for e in every if e.kind == "curve"]
    pts = gap.gap_points(exps, rows)
    assert {p["dataset"] for p in pts} == {"mtop", "break", "smcalflow"}
    assert not {p["folder"] for p in pts} & {e.name for e in exps if e.status == "superseded"}
    three = [p for p in pts if p["folder"] == "mtop-curve-round2-locked"]
    assert [p["seeds"] for p in three] == [3]  # the pooled row, not its three seeds again
    want = rows["mtop-curve-round2-locked"]["epr@2000-distill-pooled"]["oracle_gap_captured"]["gold_logprob"]
    assert three[0]["gap"] == pytest.approx(want) and three[0]["labels"] == 2000
    sizes = sorted(p["labels"] for p in pts if p["folder"] == "mtop-curve-sizes")
    assert sizes[0] == 250 and sizes[-1] == 2000
    everything = gap.gap_points([e for e in every if e.name in rows], rows)  # with the slices' sides
    series = {
        (d, s): filled for d, s, filled, _ in plots.gap_series(everything, ("mtop", "break", "smcalflow"))
    }
    assert series[("smcalflow", "dialogue-dev")] is False and series[("mtop", "dev")] is False  # hollow
    assert series[("smcalflow", "locked")] is True and series[("mtop", "locked")] is True  # filled
    index.plot_gap(pts, tmp_path / "gap.png", ("mtop", "break", "smcalflow"))
    assert (tmp_path / "gap.png").stat().st_size > 10_000


def test_a_slices_folder_pairs_two_runs_evaluation_rows_in_both_metrics_with_the_gap(tmp_path):
    """Issue 48's dev choices: two runs' evaluation rows of the same examples (``rows/per_query-<run>.jsonl.gz``)
    pair in gold log-prob and in exact match (McNemar's), and ``extra.gap`` gives each side the share of the
    base -> top gap it closes; a curve row (``rows/<name>.json``) serves as the top. The committed MTOP locked rows as
    run A; B the same examples with epr 0.5 nats higher and its first 40 wrong answers right."""
    rows, folder, put = _slices_folder(tmp_path, "per_query-locked", "per_query")

    wrong = [r["idx"] for r in rows if not r["epr"]["correct"]][:40]
    b = [
        {
            **r,
            "epr": {
                **r["epr"],
                "gold_logprob": r["epr"]["gold_logprob"] + 0.5,
                "correct": r["epr"]["correct"] or r["idx"] in wrong,
            },
        }
        for r in rows
    ]
    put("a", rows)
    put("b", b[::-1])  # another order: paired by idx
    bm25 = [r["bm25"]["gold_logprob"] for r in rows]
    top = {"key": {"retriever": "lm-oracle"}, "per_query_logprob": [v + 2.0 for v in bm25]}
    (folder / "rows" / "oracle.json").write_text(json.dumps(top))
    epr_a = float(np.mean([r["epr"]["gold_logprob"] for r in rows]))
    share = (epr_a + 0.5 - float(np.mean(bm25))) / 2.0
    decl = {
        **SLICES_DECL,
        "outcome": "b's epr is 0.5 nats above a's",
        "extra": {"pairs": ["a:epr b:epr"], "gap": {"base": "a:bm25", "top": "oracle:lm-oracle"}},
        "expected": [
            {"row": "b:epr-vs-a:epr", "field": "gain", "value": 0.5, "tol": 1e-9},
            {"row": "b:epr-vs-a:epr:em", "field": "only_b", "value": 40},
            {"row": "b:epr", "field": "oracle_gap_captured.gold_logprob", "value": share, "tol": 1e-9},
        ],
    }
    (folder / "experiment.yaml").write_text(declare.dump(decl))
    digests.write(folder)
    assert checking.check(folder) == []
    got, _ = checking.recompute(load(folder))
    em = got["b:epr-vs-a:epr:em"]
    assert (em["only_a"], em["em_b"] - em["em_a"]) == (0, pytest.approx(100 * 40 / len(rows)))
    assert em["p_mcnemar"] < 1e-9 and got["b:epr"]["em"] == pytest.approx(em["em_b"])
    lo, hi = got["b:epr"]["oracle_gap_captured_ci"]["gold_logprob"]
    assert lo < share < hi
    assert "oracle_gap_captured" not in got["a:bm25"]  # the base itself
    put("b", [{**r, "epr": {**r["epr"], "gold_logprob": r["epr"]["gold_logprob"] + 0.6}} for r in b])
    assert any("b:epr-vs-a:epr.gain" in p for p in checking.check(folder))
    top["key"]["retriever"] = "bm25"  # the top row is not the oracle the side names
    (folder / "rows" / "oracle.json").write_text(json.dumps(top))
    assert any("not a 'lm-oracle' row" in p for p in checking.check(folder))


def test_record_as_a_side_builds_a_slices_folder_that_checks(tmp_path):
    """``epr experiment record RUN FOLDER --as NAME``: two runs of the same examples side by side; the declaration's
    pairs and gap come from a person, its expected numbers from the rows (B's epr 0.5 nats above A's), the labels'
    cost where the run's evaluation counted it; a changed row then fails the check."""
    from epr.cli import main

    def up(r):
        return {**r, "epr": {**r["epr"], "gold_logprob": r["epr"]["gold_logprob"] + 0.5}}

    cost = {"distinct_sequences": 123}
    a = _run_from_committed(tmp_path / "runs" / "a", "evaluate")
    b = _run_from_committed(tmp_path / "runs" / "b", "evaluate", up, {"label_cost": cost})
    dest = tmp_path / "results" / "choices"
    (dest / "rows").mkdir(parents=True)
    rows = [json.loads(x) for x in (a / "evaluate" / "per_query.jsonl").read_text().splitlines()]
    top = {
        "key": {"retriever": "lm-oracle"},
        "per_query_logprob": [r["bm25"]["gold_logprob"] + 2 for r in rows],
    }
    (dest / "rows" / "lm-oracle.json").write_text(json.dumps(top))
    decl = {"title": "t", "dataset": "mtop", "split": "dev", "status": "supporting", "date": "2026-11-27"}
    decl["kind"], decl["outcome"] = "other", "b above a"
    decl["extra"] = {"pairs": ["a:epr b:epr"], "gap": {"base": "a:bm25", "top": "lm-oracle:lm-oracle"}}
    (dest / "experiment.yaml").write_text(declare.dump(decl))
    for run, name in ((a, "a"), (b, "b")):
        assert main(["experiment", "record", str(run), str(dest), "--as", name]) == 0
    assert checking.check(dest) == []
    exp = load(dest)
    assert (exp.kind, exp.title, exp.extra["metric"]) == ("slices", "t", "correct")
    want = {(e.row, e.field): e.value for e in exp.expected}
    assert want[("b:epr-vs-a:epr", "gain")] == pytest.approx(0.5, abs=1e-6)
    assert ("b:epr", "oracle_gap_captured.gold_logprob") in want and ("a:epr", "em") in want
    want_cost = {**cost, "scoring": []}  # the run has no scores manifest: no scoring time
    assert json.loads((dest / "label-cost-b.json").read_text()) == want_cost
    assert not (dest / "label-cost-a.json").exists()  # a run whose evaluation did not count it
    (b / "evaluate" / "per_query.jsonl").write_text(
        "".join(json.dumps(up(r)) + "\n" for r in rows[:-1]) + json.dumps(rows[-1]) + "\n"
    )
    assert main(["experiment", "record", str(b), str(dest), "--as", "b"]) == 2  # a side it holds: refused
    assert (
        main(["experiment", "record", str(b), str(dest), "--as", "b", "--overwrite"]) == 0
    )  # b's rows now differ
    assert checking.check(dest) == []  # recorded anew: its numbers are the new rows'
    d = yaml.safe_load((dest / "experiment.yaml").read_text())
    gain = next(e for e in d["expected"] if e["row"] == "b:epr-vs-a:epr" and e["field"] == "gain")
    assert gain["value"] == pytest.approx(0.5 * (len(rows) - 1) / len(rows), abs=1e-6)
    gain["value"] += 0.01  # a declared number the rows do not give
    (dest / "experiment.yaml").write_text(declare.dump(d))
    assert any("b:epr-vs-a:epr.gain" in p for p in checking.check(dest))


def test_the_gap_plot_draws_a_slices_folders_sides_at_their_label_counts():
    """A slices folder's learned sides (epr, hybrid) with a gap share and a recorded label cost are points of
    results/gap-vs-labels.png, at the label count of their round 1 (MTOP's dev choices: 2,000, 4,000 with two rounds
    and three, 8,000); a side without a label cost is not drawn, nor a run's BM25 or SBERT side (r8000gpu's device
    controls, r2000's SBERT): they cost no labels."""
    e = load(RESULTS / "mtop-recipe-choices")
    rows = {e.name: checking.recompute(e)[0]}
    pts = gap.gap_points([e], rows)
    want = []  # read independently: every run with a label-cost file, once per learned side it has a row for
    for f in sorted(e.folder.glob("label-cost-*.json")):
        run, cost = f.stem.removeprefix("label-cost-"), json.loads(f.read_text())
        for side in (f"{run}:epr", f"{run}:hybrid"):
            if side in rows[e.name]:
                want.append((cost["rounds"][0]["examples"], cost["scored_sequences"]))
    assert sorted((p["labels"], p["scored_sequences"]) for p in pts) == sorted(want)
    assert {(2000, 56920), (4000, 112691), (4000, 129527), (8000, 225967)} <= set(want)
    assert {"r2000:sbert", "r8000gpu:bm25"} <= set(rows[e.name])  # there, with a gap share, and not drawn
    assert all(p["gap"] != rows[e.name]["r8000gpu:bm25"]["oracle_gap_captured"]["gold_logprob"] for p in pts)
    want_gap = {
        n: r["oracle_gap_captured"]["gold_logprob"]
        for n, r in rows[e.name].items()
        if n in ("r4000:epr", "r4000:hybrid")
    }
    got = sorted(p["gap"] for p in pts if p["scored_sequences"] == 112691)
    assert got == pytest.approx(sorted(want_gap.values()))


def test_the_gap_plot_draws_a_locked_looks_pooled_seeds_once_and_a_served_side_once():
    """MTOP's 3-seed locked look (``s42:served,s1:served,s2:served``; each seed's select served epr) is one point of
    3 seeds at 8,000 labels, standing for each seed and the 2-seed pool, its cost the largest seed's; where a run
    has its own row of what select served (BREAK's and SMCalFlow's dev choices), its served side is not drawn again."""
    e = load(RESULTS / "mtop-8000-locked")
    rows = {e.name: checking.recompute(e)[0]}
    (pt,) = gap.gap_points([e], rows)
    pooled = "s42:served,s1:served,s2:served"
    assert (pt["row"], pt["seeds"], pt["labels"], pt["locked"]) == (pooled, 3, 8000, True)
    assert pt["gap"] == rows[e.name][pooled]["oracle_gap_captured"]["gold_logprob"]
    costs = [json.loads((e.folder / f"label-cost-{s}.json").read_text()) for s in ("s42", "s1", "s2")]
    assert pt["scored_sequences"] == max(c["scored_sequences"] for c in costs)
    for name in ("break-recipe-choices", "smcalflow-recipe-choices"):
        e = load(RESULTS / name)
        rows = {e.name: checking.recompute(e)[0]}
        got = sorted(p["row"] for p in gap.gap_points([e], rows))
        runs = sorted(f.stem.removeprefix("label-cost-") for f in e.folder.glob("label-cost-*.json"))
        assert got == sorted(f"{r}:{t}" for r in runs for t in ("epr", "hybrid")), name


def test_the_cost_table_lists_each_counted_point_beside_its_gap():
    """results/README.md's "What the labels cost" (issue 48): each point whose labels' LM cost was counted, in the
    datasets' order then by label count, with its sequences and its share of the gap; uncounted points are left out,
    and no counted point leaves no table."""

    def pt(ds, labels, scored, gap=0.25, ci=(0.1, 0.4)):
        return {"dataset": ds, "split": "dev", "locked": False, "folder": f"{ds}-f", "row": "r:epr",
                "labels": labels, "seeds": 1, "scored_sequences": scored, "gap": gap, "ci": ci}  # fmt: skip

    pts = [
        pt("break", 4000, 114304),
        pt("mtop", 2000, 56920, 0.3),
        pt("mtop", 1000, None),
        pt("break", 2000, 56591),
    ]
    lines = gap.cost_table(pts, ("mtop", "break", "smcalflow"))
    body = [x for x in lines if x.startswith("| ") and not x.startswith("| dataset")]
    assert [x.split(" | ")[0] + " " + x.split(" | ")[4] for x in body] == [
        "| mtop 2,000", "| break 2,000", "| break 4,000"
    ]  # fmt: skip
    assert body[2].endswith("| 114,304 | 0.25 (0.10 to 0.40) |")
    assert gap.cost_table([pt("mtop", 1000, None)]) == []
    text, _ = index.build(RESULTS)
    assert (
        "| break | dev | [break-recipe-choices](break-recipe-choices/) | r4000mpnet:hybrid | 4,000 | 1 | 114,304 |"
        in text
    )


def test_a_slices_folder_pools_seeds_and_reads_what_select_served(tmp_path):
    """A pre-registered 3-seed locked look (issue 48) as a slices folder: ``<seed>:served`` is the retriever the
    seed's ``select`` served (``select-report-<seed>.json``), and sides joined by commas are one side pooled per
    example (the seeds' mean gold log-prob and exact match, as the curve folders pool), paired with BM25 in both
    metrics and given its gap share. Seeds of other examples are refused."""
    rows, folder, put = _slices_folder(tmp_path, "per_query-locked", "per_query")
    shift = {"s1": 0.3, "s2": 0.6, "s3": 0.9}
    for s, d in shift.items():
        put(
            s,
            [{**r, "hybrid": {**r["hybrid"], "gold_logprob": r["hybrid"]["gold_logprob"] + d}} for r in rows],
        )
    served = {"s1": "epr", "s2": "hybrid", "s3": "hybrid"}
    for s, name in served.items():
        (folder / f"select-report-{s}.json").write_text(json.dumps({"selected": name}))
    top = {
        "key": {"retriever": "lm-oracle"},
        "per_query_logprob": [r["bm25"]["gold_logprob"] + 2.0 for r in rows],
    }
    (folder / "rows" / "oracle.json").write_text(json.dumps(top))
    pooled = "s1:served,s2:served,s3:served"
    decl = {
        **SLICES_DECL,
        "outcome": "pooled",
        "extra": {"pairs": [f"s1:bm25 {pooled}"], "gap": {"base": "s1:bm25", "top": "oracle:lm-oracle"}},
    }
    (folder / "experiment.yaml").write_text(declare.dump(decl))
    got, problems = checking.recompute(load(folder))
    assert problems == []
    epr = np.array([r["epr"]["gold_logprob"] for r in rows])
    hyb = np.array([r["hybrid"]["gold_logprob"] for r in rows])
    want = (epr + (hyb + 0.6) + (hyb + 0.9)) / 3  # s1 served epr, s2 and s3 hybrid, each shifted
    assert got[pooled]["gold_logprob"] == pytest.approx(float(want.mean()))
    assert got[pooled]["seeds"] == 3 and got[pooled]["n"] == len(rows)
    em = np.mean(
        [[r["epr"]["correct"], r["hybrid"]["correct"], r["hybrid"]["correct"]] for r in rows], axis=1
    )
    assert got[pooled]["em"] == pytest.approx(100 * em.mean())
    pair = got[f"{pooled}-vs-s1:bm25"]
    bm25 = np.array([r["bm25"]["gold_logprob"] for r in rows])
    assert pair["gain"] == pytest.approx(float((want - bm25).mean()))
    assert got[f"{pooled}-vs-s1:bm25:em"]["em_b"] == pytest.approx(got[pooled]["em"])
    assert got[pooled]["oracle_gap_captured"]["gold_logprob"] == pytest.approx(
        float((want - bm25).mean()) / 2.0
    )
    put("s3", rows[:-1])  # one seed holds other examples
    assert any("not the same examples" in p for p in checking.recompute(load(folder))[1])


def test_a_planned_locked_look_takes_its_seeds_one_at_a_time_and_declares_numbers_when_all_are_in(
    tmp_path, capsys
):
    """A pre-registered 3-seed look (issue 48) is committed as ``status: planned`` with its pooled pairs and tests
    before it runs; the check passes it without rows. Each seed recorded (``--part locked --as sN``) adds its rows
    and the folder stays planned, with no numbers, while a test cannot be computed; the last seed makes every test
    compute, and the folder turns supporting with its numbers recomputed from the rows. ``epr experiment show``
    reads the rows of the seeds in so far, and names the pairs that wait for the others. A planned folder that
    declares numbers fails the check."""
    from epr.cli import main

    dest = tmp_path / "results" / "locked"
    dest.mkdir(parents=True)
    (dest / "PLAN.md").write_text("the plan, committed first\n")
    pooled = "s1:served,s2:served,s3:served"
    decl = {**SLICES_DECL, "split": "locked", "status": "planned", "date": "2026-11-27 14:30"}
    decl |= {"preregistration": "PLAN.md", "outcome": "planned", "seeds": [1, 2, 3]}
    decl["extra"] = {"pairs": [f"s1:bm25 {pooled}"]}
    decl["tests"] = [{"row": f"{pooled}-vs-s1:bm25:em", "field": "p_mcnemar", "says": "EM vs BM25"}]
    (dest / "experiment.yaml").write_text(declare.dump(decl))
    digests.write(dest)
    assert checking.check(dest) == []  # planned: no rows yet
    for i, s in enumerate(("s1", "s2", "s3")):

        def up(r, d=0.1 * (i + 1)):  # the served row (mtop-default-recipe's select served hybrid)
            return {**r, "hybrid": {**r["hybrid"], "gold_logprob": r["hybrid"]["gold_logprob"] + d}}

        run = _run_from_committed(tmp_path / "runs" / s, "locked/evaluate", up)
        assert main(["experiment", "record", str(run), str(dest), "--part", "locked", "--as", s]) == 0
        d = yaml.safe_load((dest / "experiment.yaml").read_text())
        assert (dest / "rows" / f"per_query-{s}.jsonl.gz").exists()
        if s != "s3":
            assert d["status"] == "planned" and not d.get("expected") and checking.check(dest) == []
            ledger = [
                x
                for x in index.build(tmp_path / "results")[0].splitlines()
                if "[locked](locked/) | [yes]" in x
            ]
            want = "recorded so far: s1" + (", s2" if s == "s2" else "")  # in the declared seeds' order
            assert len(ledger) == 1 and f"(planned: {want})" in ledger[0]
        if s == "s1":  # one seed in: its rows read, the pooled pair waits for s2's files
            capsys.readouterr()
            assert main(["experiment", "show", str(dest)]) == 0
            shown = capsys.readouterr().out.splitlines()
            with gzip.open(dest / "rows" / "per_query-s1.jsonl.gz", "rt") as f:  # read here, not by recompute
                rows = [json.loads(x) for x in f]
            served = next(x for x in shown if x.startswith("  s1:served:"))  # hybrid, as its select served
            lp = np.mean([r["hybrid"]["gold_logprob"] for r in rows])
            em = 100 * np.mean([r["hybrid"]["correct"] for r in rows])
            assert f"n {len(rows)}, gold log-prob {lp:.3f}, EM {em:.1f}" in served
            assert any(x.startswith("  not computed: pair 's1:bm25 " + pooled) and "s2" in x for x in shown)
    assert d["status"] == "supporting" and d["tests"] == decl["tests"]
    assert checking.check(dest) == []
    got, _ = checking.recompute(load(dest))
    assert (
        json.loads((RESULTS / "mtop-default-recipe" / "select-report.json").read_text())["selected"]
        == "hybrid"
    )
    assert got[pooled]["seeds"] == 3 and f"{pooled}-vs-s1:bm25:em" in {e["row"] for e in d["expected"]}
    # the seeds' served rows are +0.1, +0.2, +0.3 nats over the committed ones: pooled, s1's +0.1
    assert got[pooled]["gold_logprob"] == pytest.approx(got["s1:served"]["gold_logprob"] + 0.1)
    d["status"] = "planned"
    (dest / "experiment.yaml").write_text(declare.dump(d))
    assert any("planned declares expected" in p for p in checking.check(dest))


def test_show_reads_a_committed_curve_folder_row_by_row(capsys):
    """``epr experiment show`` on a committed curve folder: one line per recomputed row, its gold log-prob as the
    committed curve.json has it, exact match only where the row has one, and seeds only where a row pools them."""
    from epr.cli import main

    folder = RESULTS / "mtop-curve-locked"
    assert main(["experiment", "show", str(folder)]) == 0
    shown = capsys.readouterr().out.splitlines()
    committed = json.loads((folder / "curve.json").read_text())
    rows = committed["rows"] if isinstance(committed, dict) else committed
    assert len(shown) == 1 + len(rows)
    for line in shown[1:]:
        assert "None" not in line and ("seeds pooled" in line) == ("pooled" in line.split(":")[0])
    lp = {checking.row_name(r): r.get("gold_logprob") for r in rows}
    assert sum(isinstance(v, (int, float)) for v in lp.values()) == len(rows)
    for name, v in lp.items():
        if isinstance(v, (int, float)):
            assert any(x.startswith(f"  {name}:") and f"gold log-prob {v:.3f}" in x for x in shown), name


def test_a_paired_headline_names_the_folders_metric():
    """A slices folder's headline on paired rows reads the ``em`` fields, which hold the folder's ``extra.metric``
    per example: BREAK's headline says LF-EM, not exact match, and picks p against the better reference."""
    from types import SimpleNamespace

    got = {
        "s:epr": {"em": 40.0, "gold_logprob": -3.0},
        "s:epr-vs-s:bm25": {"gain": 0.4, "p_wilcoxon": 1e-3},
        "s:epr-vs-s:bm25:em": {"em_a": 30.0, "p_mcnemar": 0.01},
        "s:epr-vs-s:sbert:em": {"em_a": 32.0, "p_mcnemar": 0.04},
    }
    test = SimpleNamespace(row="s:epr-vs-s:bm25:em")
    for extra, want in (({"metric": "lf_em"}, "lf_em"), ({}, "em")):
        e = SimpleNamespace(tests=(test,), extra=extra, kind="slices", dataset="break")
        name, h = index.headline(e, got)
        assert (name, h["metric_name"], h["metric"], h["refs"]) == ("s:epr", want, 40.0, [30.0, 32.0])
        assert (h["p"], h["p_row"], h["gain"]) == (0.04, "s:epr-vs-s:sbert:em", 0.4)


def test_a_truncated_row_file_is_named(tmp_path, capsys):
    """Issue 76's crack: a truncated row file's 'malformed JSON' named no file."""
    from epr.cli import main

    f = _copy(tmp_path, "mtop-curve-round2-locked")
    row = f / "rows" / "epr@2000-distill-s1.json"
    row.write_text(row.read_text()[:500])
    assert main(["experiment", "check", str(f)]) != 0
    out = capsys.readouterr()
    assert "rows/epr@2000-distill-s1.json: malformed JSON" in out.out + out.err


def test_a_failing_record_writes_nothing(tmp_path):
    """Issue 75: a record that fails part way (here: a malformed evaluation row) leaves the folder as it was."""
    from epr.experiments.record import record, record_side

    run = _run_from_committed(tmp_path / "runs" / "mtop", "locked/evaluate")
    rows = run / "locked" / "evaluate" / "per_query.jsonl"
    rows.write_text(rows.read_text()[:-40] + "\n")  # the last row cut mid-object
    dest = tmp_path / "results" / "new"
    dest.mkdir(parents=True)
    (dest / "PLAN.md").write_text("the plan")
    for call in (lambda: record(run, dest, "locked"), lambda: record_side(run, dest, "a", "locked")):
        with pytest.raises(ValueError):
            call()
        assert [p.name for p in dest.iterdir()] == ["PLAN.md"]
        assert [p.name for p in dest.parent.iterdir()] == ["new"]  # no staging copy left beside it


def _one_number_edited(path: Path) -> bool:
    """The file's first decimal number raised by 1 (one example's value: a nat, or a true/false flipped where it
    holds no decimal), gzip kept; False where it holds neither."""
    import re

    raw = path.read_bytes()
    gz = raw[:2] == b"\x1f\x8b"
    text = (gzip.decompress(raw) if gz else raw).decode("utf-8", "replace")
    m = re.search(r"-?\d+\.\d+", text)
    if m:
        text = text[: m.start()] + repr(float(m.group()) + 1.0) + text[m.end() :]
    elif "true" in text:
        text = text.replace("true", "false", 1)
    else:
        return False
    data = text.encode()
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return True


@pytest.mark.parametrize(
    "name",
    ["break-curve-locked-em", "mtop-default-recipe", "mtop-8000-locked", "truthfulqa", "mtop-curve"],
)  # a curve, a run, a slices folder and two kind: other (the decisive TruthfulQA one among them)
def test_a_one_number_edit_to_any_pinned_file_of_any_folder_kind_fails(tmp_path, name):
    """Issue 75's audit: a 1-nat edit to one example of a row no declared number reads passed ``check``. Every data
    file is pinned now: the same edit to each file of the folder, one at a time, fails, naming the file; the
    untouched copy passes."""
    dst = tmp_path / name
    shutil.copytree(RESULTS / name, dst)
    exp = load(dst)
    assert exp.files and digests.problems(dst, exp.files) == []
    edited = 0
    for rel in digests.pinned(dst):
        keep = (dst / rel).read_bytes()
        if not _one_number_edited(dst / rel):
            continue
        edited += 1
        assert digests.problems(dst, exp.files) == [
            f"{rel.as_posix()}: its sha256 is not the pinned one (an edited example, or a rerun not re-pinned)"
        ]
        (dst / rel).write_bytes(keep)
    assert edited >= 1
    (dst / "rows" / "extra.json").parent.mkdir(exist_ok=True)
    (dst / "rows" / "extra.json").write_text("{}")  # a row slipped in beside the pinned ones
    assert digests.problems(dst, exp.files) == ["rows/extra.json: not pinned (files does not list it)"]


def test_an_exact_match_flip_in_a_row_no_pair_reads_fails(tmp_path):
    """The audit's other attack: an EM flip in a row of ``mtop-8000-locked`` that no declared pair uses."""
    dst = tmp_path / "mtop-8000-locked"
    shutil.copytree(RESULTS / "mtop-8000-locked", dst)
    f = dst / "rows" / "per_query-s1.jsonl.gz"
    lines = gzip.decompress(f.read_bytes()).decode().splitlines()
    r = json.loads(lines[3])
    unpaired = next(k for k, v in r.items() if isinstance(v, dict) and "correct" in v and k not in ("bm25",))
    r[unpaired]["correct"] = not r[unpaired]["correct"]
    lines[3] = json.dumps(r)
    f.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0))
    assert any("rows/per_query-s1.jsonl.gz: its sha256" in p for p in checking.check(dst))


def test_a_comparison_across_folders_recomputes_and_fails_on_the_other_folders_row(tmp_path):
    """Issue 75: the pre-registered tests that pair two folders' rows (listwise against distill) are declared
    (``comparisons``), recomputed as ``cmp:`` rows, and in Holm's family; a one-nat change to one example of the
    *other* folder's row (re-pinned there, so only the recomputation can catch it) fails this folder's check."""
    for name in ("mtop-curve-round2-listwise-locked", "mtop-curve-round2-listwise", "mtop-curve-round2-locked",
                 "mtop-curve-round2"):  # fmt: skip
        shutil.copytree(RESULTS / name, tmp_path / name)
    f = tmp_path / "mtop-curve-round2-listwise-locked"
    assert checking.check(f) == []
    exp = load(f)
    assert {"cmp:listwise-vs-distill", "cmp:listwise-vs-distill-em"} <= {t.row for t in exp.tests}
    got, _ = checking.recompute(exp)
    assert got["cmp:listwise-vs-distill"]["p_wilcoxon"] == pytest.approx(0.281, abs=0.001)
    fam = index.family([exp], {exp.name: got})
    assert (exp.name, "cmp:listwise-vs-distill-em", "p_mcnemar") in fam
    other = tmp_path / "mtop-curve-round2-locked"
    row = other / "rows" / "epr@2000-distill-s2.json"
    d = json.loads(row.read_text())
    d["per_query_logprob"][11] -= (
        30.0  # one example of the reference side, 30 nats lower: the pooled mean moves 0.008
    )
    row.write_text(json.dumps(d))
    digests.write(other)
    assert any("cmp:listwise-vs-distill.gain" in p for p in checking.check(f))


def test_a_malformed_comparison_names_the_key(tmp_path):
    f = _copy(tmp_path, "mtop-default-recipe")
    d = yaml.safe_load((f / "experiment.yaml").read_text())
    d["comparisons"] = {"x": {"a": "rows/a.json"}}
    (f / "experiment.yaml").write_text(yaml.safe_dump(d))
    with pytest.raises(InputError, match="comparisons.x: expected a mapping with a, b"):
        load(f)


MACHINE_PATH = r"(?<![\w.~-])/(?:work|tmp|home|root|Users|mnt|scratch)/"


def test_no_file_under_results_names_a_machines_path():
    """Issue 75: commands are templates ({run_root}, {out}, {seed}); no file under results/ names one machine's
    folders (the records too: logs, recorded command lines and lm-eval's output read {run_root}, {venv}, {cache},
    {data_dir} where the machine's path was)."""
    import re

    text_files = [p for p in sorted(RESULTS.rglob("*")) if p.is_file() and p.suffix not in (".gz", ".png")]
    bad = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in text_files
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if re.search(MACHINE_PATH, line)
    ]
    assert bad == []
    assert re.search(MACHINE_PATH, "--run-root /work/runs-wt/runs") and not re.search(
        MACHINE_PATH, "{run_root}/x"
    )


def test_every_decisive_folders_commands_run_as_written_dry(capsys):
    """``epr experiment run --dry-run`` on every decisive folder: each template filled, each file a command names
    present in this checkout, a {seed} command once per declared seed."""
    from epr.cli import main

    decisive = [f for f in checking.folders(RESULTS) if load(f).status == "decisive"]
    assert len(decisive) >= 10
    for f in decisive:
        assert main(["experiment", "run", str(f), "--dry-run"]) == 0, f.name
    out = capsys.readouterr().out
    assert "{" not in "".join(x for x in out.splitlines() if x.startswith("$ "))
    assert all(f"--as s{s}" in out for s in (42, 1, 2))  # mtop-8000-locked's record, per seed
    assert "env OUT=runs/rerun/truthfulqa RUN_ROOT=runs sh scripts/truthfulqa_full.sh" in out


def test_a_command_naming_a_missing_file_or_an_unknown_template_fails_dry(tmp_path, capsys):
    from epr.cli import main
    from epr.cli.experiment import rerun_command

    f = _copy(tmp_path, "mtop-default-recipe")
    d = yaml.safe_load((f / "experiment.yaml").read_text())
    d["commands"] = ["epr cache import results/no-such-folder/scores.json.gz --set run_root={run_root}"]
    (f / "experiment.yaml").write_text(declare.dump(d))
    assert main(["experiment", "run", str(f), "--dry-run"]) != 0
    assert (
        "names files this checkout lacks: ['results/no-such-folder/scores.json.gz']"
        in capsys.readouterr().err
    )
    with pytest.raises(InputError, match="unknown template"):
        rerun_command("epr run --set run_root={machine}", Path("y"), "r")


def test_a_several_seed_folders_headline_shows_the_seeds_pooled():
    """Issue 75, item 5: the listwise MTOP row showed seed 42's 38.8 EM under "3 seeds" (pooled 37.9). Every
    decisive curve folder of several seeds heads the index with a pooled row; a comparison with another folder
    (``cmp:``) never heads it."""
    seen = 0
    for f in checking.folders(RESULTS):
        e = load(f)
        if e.status != "decisive" or e.kind != "curve" or len(e.seeds) < 2:
            continue
        name, h = index.headline(e, checking.recompute(e)[0])
        assert name.endswith("-pooled"), (f.name, name)
        seen += 1
    assert seen >= 5
    e = load(RESULTS / "mtop-curve-round2-listwise-locked")
    name, h = index.headline(e, checking.recompute(e)[0])
    assert name == "epr@2000-listwise-pooled" and round(h["metric"], 1) == 37.9


def test_truthfulqa_is_recomputed_from_its_per_question_rows(tmp_path):
    """The decisive TruthfulQA folder had nothing to check (kind other): each report's MC1 / MC2 / MC3 / DPO per
    variant is now recomputed from ``per_question.jsonl`` against its ``results.json`` and the declared numbers; one
    question's MC1 flipped (the file re-pinned, so only the recomputation can catch it) fails."""
    dst = tmp_path / "truthfulqa"
    shutil.copytree(RESULTS / "truthfulqa", dst)
    assert checking.check(dst) == []
    got, _ = checking.recompute(load(dst))
    assert got["smollm2-fp32:rel"]["mc1"] == pytest.approx(0.38188, abs=1e-5)
    pq = dst / "smollm2-fp32" / "per_question.jsonl"
    lines = pq.read_text().splitlines()
    i = next(k for k, x in enumerate(lines) if json.loads(x)["set"] == "rel")
    r = json.loads(lines[i])
    r["mc1"] = 1.0 - r["mc1"]
    lines[i] = json.dumps(r)
    pq.write_text("\n".join(lines) + "\n")
    digests.write(dst)
    problems = checking.check(dst)
    assert any("smollm2-fp32/results.json: rel.mc1" in p for p in problems)
    assert any("expected smollm2-fp32:rel.mc1" in p for p in problems)


def test_a_decisive_or_supporting_folder_must_declare_numbers(tmp_path):
    f = _copy(tmp_path, "mtop-curve")
    d = yaml.safe_load((f / "experiment.yaml").read_text())
    d.pop("expected")
    (f / "experiment.yaml").write_text(declare.dump(d))
    assert any("declares no expected number" in p for p in checking.check(f))


def test_the_ledger_shows_the_means_t_test_beside_a_wilcoxon_p():
    """Issue 75, item 3: a Wilcoxon p tests a median shift; SMCalFlow's round 2 over round 1 (+0.60 nats, Wilcoxon
    0.0096) does not hold as a mean (t-test 0.39), and the ledger says so beside the test."""
    text = (RESULTS / "README.md").read_text()
    ledger = text.split("## The ledger of locked looks")[1]
    line = next(x for x in ledger.splitlines() if "[smcalflow-curve-round2-locked](" in x)
    assert "round 2 hybrid vs round 1" in line and "[mean: t-test 0.39]" in line
    assert index._mean_test({"p_ttest": 0.5}, "p_wilcoxon") == " [mean: t-test 0.5]"
    assert index._mean_test({"p_ttest": 0.5}, "p_mcnemar") == ""  # exact match: no mean to test
