"""How far exact match read off the gold pass (``--em-method greedy``) agrees with generated exact match, row by row.

    epr experiment em-agreement results/mtop-curve-round2-listwise-locked/rows results/em-greedy-check/rows

Reads the ``em-<name>.json.gz`` rows both folders hold (the first generated, the second read off the gold pass, on
the same examples) and reports per row: exact match under each method, the examples counted by one method only, the
per-example agreement, and each row's exact McNemar p vs BM25 under each method (does the verdict change?). The
greedy check is a lower bound (an example it counts, greedy decoding reproduces token for token): examples it
counts that generation does not come only from float rounding at near-ties between the two passes.
"""

from __future__ import annotations

from pathlib import Path

from epr.reports.curve import em_method

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
