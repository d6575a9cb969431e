"""How far exact match read off the gold pass (``--em-method greedy``) agrees with generated exact match, row by row.

    python scripts/em_agreement.py results/mtop-curve-round2-listwise-locked/rows results/em-greedy-check/rows

Reads the ``em-<name>.json.gz`` rows both folders hold (the first generated, the second read off the gold pass, on
the same examples) and reports per row: exact match under each method, the examples counted by one method only, the
per-example agreement, and each row's exact McNemar p vs BM25 under each method (does the verdict change?). The
greedy check is a lower bound (an example it counts, greedy decoding reproduces token for token): examples it
counts that generation does not come only from float rounding at near-ties between the two passes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from epr.reports.curve import em_method, paired_p
from epr.reports.curve_rows import load_em

ROOT = Path(__file__).resolve().parents[2]  # the repository


def agreement(gen: dict, greedy: dict) -> dict:
    """One row's two measurements on the same examples (pure: the numbers the script prints)."""
    if em_method(gen) != "generate" or em_method(greedy) != "greedy":
        raise ValueError(
            f"expected a generated and a greedy row, got {em_method(gen)} and {em_method(greedy)}"
        )
    if gen["idx"] != greedy["idx"]:
        raise ValueError("the two rows hold different examples")
    a, b = gen["correct"], greedy["correct"]
    n = len(a)
    return {
        "n": n,
        "em_generate": 100.0 * sum(a) / n,
        "em_greedy": 100.0 * sum(b) / n,
        "generate_only": sum(x and not y for x, y in zip(a, b)),
        "greedy_only": sum(y and not x for x, y in zip(a, b)),
        "agreement": sum(x == y for x, y in zip(a, b)) / n,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
        r = agreement(gen[x], gr[x])
        p = ""
        if x != "bm25" and "bm25" in names:
            p = f"{paired_p(gen[x], gen['bm25']):.3g} / {paired_p(gr[x], gr['bm25']):.3g}"
        print(
            f"| {x} | {r['n']} | {r['em_generate']:.1f} | {r['em_greedy']:.1f} | {r['generate_only']} | "
            f"{r['greedy_only']} | {100 * r['agreement']:.2f}% | {p} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
