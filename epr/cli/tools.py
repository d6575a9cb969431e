"""``epr experiment compare-labels | compare-rows | em-agreement | collect | reselect``: the options and the printed reports of
the results tools (the library functions they call live in ``epr.experiments``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from epr.experiments import collect_results, compare_labels, compare_rows, em_agreement
from epr.reports.curve import paired_p
from epr.reports.curve_rows import load_em

__all__ = ["TOOLS"]


def compare_labels_main(argv: list[str] | None = None, prog: str | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog, description=compare_labels.__doc__.splitlines()[0])
    ap.add_argument("a", type=Path, help="labels folder (or labels.jsonl) A")
    ap.add_argument("b", type=Path, help="labels folder (or labels.jsonl) B")
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    ap.add_argument("--k", type=int, default=3, help="top k compared (labels.k_pos)")
    args = ap.parse_args(argv)
    c = compare_labels.compare(compare_labels.load(args.a), compare_labels.load(args.b), args.k)
    if args.json:
        print(json.dumps(c, indent=1))
        return 0
    print(
        f"{c['examples']} training examples in both ({c['only_a']} only in A, {c['only_b']} only in B); "
        f"candidates shared: {c['candidates_shared']:.1%}\n"
        f"best candidate's LM score (mean, nats): A {c['best_a']:.2f}, B {c['best_b']:.2f}; "
        f"B's best higher on {c['best_b_higher']:.1%}, lower on {c['best_b_lower']:.1%}\n"
        f"median candidate's LM score (mean, nats): A {c['median_a']:.2f}, B {c['median_b']:.2f}"
    )
    if c["rank_agreement"] is not None or c["top_k_shared"] is not None:
        rho, top = c["rank_agreement"], c["top_k_shared"]
        print(
            f"on the shared candidates: Spearman {'n/a' if rho is None else f'{rho:.3f}'} (mean over "
            f"{c['rank_agreement_examples']} examples); A's top {c['top_k']} among B's: "
            f"{'n/a (no example shares more than k)' if top is None else f'{top:.1%}'} (the same top "
            f"{c['top_k']} on {c['top_k_identical'] or 0:.1%} of examples); score |A - B|: mean "
            f"{c['score_abs_diff_mean']:.3f}, max {c['score_abs_diff_max']:.3f} nats"
        )
    if "same_candidates_examples" in c:
        print(
            f"the labels training reads, on the {c['same_candidates_examples']} examples with the same candidates in "
            f"both: the same positives on {c['positives_identical']:.1%}, the same hard negatives on "
            f"{c['negatives_identical']:.1%}"
        )
    return 0


def compare_rows_main(argv: list[str] | None = None, prog: str | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog=prog, description=compare_rows.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("a", help="row A (the reference); several seeds' rows joined by commas are pooled")
    ap.add_argument("b", help="row B; several seeds' rows joined by commas are pooled")
    ap.add_argument("--json", action="store_true", help="print the comparison as JSON")
    args = ap.parse_args(argv)
    r = compare_rows.compare(compare_rows.load_side(args.a), compare_rows.load_side(args.b), args.a, args.b)
    seeds = (
        f" (seeds pooled: A {r['seeds_a']}, B {r['seeds_b']})" if r["seeds_a"] > 1 or r["seeds_b"] > 1 else ""
    )
    if args.json:
        print(json.dumps(r, indent=2))
    elif r["metric"] == "gold_logprob":
        print(
            f"gold log-prob on {r['n']} examples ({r['left_out']} left out): A {r['mean_a']:.3f}, B {r['mean_b']:.3f}; "
            f"B - A {r['gain']:+.3f} nats (95% CI {r['gain_ci'][0]:+.3f} to {r['gain_ci'][1]:+.3f}; median "
            f"{r['median_gain']:+.3f}, B higher on {100 * r['win_rate']:.0f}%), Wilcoxon p = {r['p_wilcoxon']:.2g}{seeds}"
        )
    else:
        test = "exact sign test" if seeds else "McNemar"
        print(
            f"exact match on {r['n']} examples: A {r['em_a']:.1f}, B {r['em_b']:.1f}; A higher on {r['only_a']}, "
            f"B higher on {r['only_b']}; {test} p = {r['p_mcnemar']:.2g}{seeds}"
        )
    return 0


def em_agreement_main(argv: list[str] | None = None, prog: str | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog=prog, description=em_agreement.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("generated", type=Path, help="a rows/ folder of generated exact-match rows")
    ap.add_argument("greedy", type=Path, help="a rows/ folder of the same rows read off the gold pass")
    a = ap.parse_args(argv)
    gen, gr = load_em(a.generated), load_em(a.greedy)
    names = [x for x in gen if x in gr]
    if not names:
        ap.error(f"no exact-match row is in both {a.generated} and {a.greedy}")
    print(
        "| row | n | EM generated | EM greedy | generated only | greedy only | agreement | p vs BM25 (generated / greedy) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for x in names:
        r = em_agreement.agreement(gen[x], gr[x])
        p = ""
        if x != "bm25" and "bm25" in names:
            p = f"{paired_p(gen[x], gen['bm25']):.3g} / {paired_p(gr[x], gr['bm25']):.3g}"
        print(
            f"| {x} | {r['n']} | {r['em_generate']:.1f} | {r['em_greedy']:.1f} | {r['generate_only']} | "
            f"{r['greedy_only']} | {100 * r['agreement']:.2f}% | {p} |"
        )
    return 0


def collect_results_main(argv: list[str] | None = None, prog: str | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog, description=collect_results.__doc__.split("\n", 1)[0])
    ap.add_argument("names", nargs="+", help="run names (the config's `name`)")
    ap.add_argument("--run-root", default=str(collect_results.ROOT / "runs"))
    ap.add_argument("--dest", help="destination folder (one name only); default results/<name>[-locked]")
    ap.add_argument(
        "--part", choices=("dev", "locked"), default="dev", help="the compared part (data.eval_part)"
    )
    a = ap.parse_args(argv)
    if a.dest and len(a.names) > 1:
        ap.error("--dest takes one run name")
    for name in a.names:
        dest = (
            Path(a.dest)
            if a.dest
            else collect_results.ROOT / "results" / (name + ("-locked" if a.part == "locked" else ""))
        )
        try:
            copied = collect_results.collect(Path(a.run_root) / name, dest, a.part)
        except FileNotFoundError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"{name}: {', '.join(copied)} -> {dest}")
    return 0


def reselect_main(argv: list[str] | None = None, prog: str | None = None) -> int:
    from epr.stages.select import reselect

    ap = argparse.ArgumentParser(prog=prog, description=reselect.__doc__.split("\n")[0].rstrip(":"))
    ap.add_argument(
        "run",
        type=Path,
        help="a run folder whose select stage finished (or its select/ folder), or a results folder's committed "
        "rows/select-NAME.jsonl.gz (its select-report-NAME.json beside them)",
    )
    ap.add_argument(
        "--retrievers", required=True, help="the modes to choose among, comma-separated (epr,hybrid)"
    )
    ap.add_argument(
        "--weigh", choices=("logprob", "logprob+em"), default="logprob", help="select.weigh's rule"
    )
    ap.add_argument("--alpha", type=float, default=None, help="select.alpha (default: the run's)")
    ap.add_argument("--out", type=Path, help="write the report as JSON here")
    a = ap.parse_args(argv)
    d = a.run if a.run.is_file() or (a.run / "per_example.jsonl").exists() else a.run / "select"
    r = reselect(d, [x.strip() for x in a.retrievers.split(",") if x.strip()], a.weigh, a.alpha)
    if a.out:
        a.out.write_text(json.dumps(r, indent=2) + "\n")
    print(f"among {', '.join(r['retrievers'])} ({a.weigh}, {r['n']} held-out pool examples): {r['selected']}. "
          f"{r['reason']}")  # fmt: skip
    return 0


TOOLS: dict = {  # epr experiment <name>: (its main, the script path older results folders recorded, or None)
    "compare-labels": (compare_labels_main, "scripts/compare_labels.py"),
    "compare-rows": (compare_rows_main, "scripts/compare_rows.py"),
    "em-agreement": (em_agreement_main, "scripts/em_agreement.py"),
    "collect": (collect_results_main, "scripts/collect_results.py"),
    "reselect": (reselect_main, None),  # no script before it
}
