"""``epr experiment curve``: the learning curve's options (``epr.experiments.curve`` runs it)."""

from __future__ import annotations

import argparse
import json
import logging
import shlex
from pathlib import Path

from epr.experiments import curve

__all__ = ["build_parser", "main"]


def _csv(kind=str):
    return lambda s: [kind(x) for x in s.split(",") if x]


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    d = curve.CurveSpec()
    ap = argparse.ArgumentParser(
        prog=prog, description=curve.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("-c", "--config", default=d.config)
    ap.add_argument("--sizes", type=_csv(int), default=d.sizes)
    ap.add_argument("--losses", type=_csv(), default=d.losses)
    ap.add_argument(
        "--em", choices=("largest", "all", "none"), default=d.em, help="which learned rows get exact match"
    )
    ap.add_argument(
        "--em-method",
        choices=("generate", "greedy"),
        default=d.em_method,
        help="exact match by greedy generation (the pipeline's predict stage), or read off the gold log-prob's "
        "pass (greedy: every gold token is the LM's greedy choice; a lower bound of generated EM, ~no extra cost)",
    )
    ap.add_argument("--refs", type=_csv(), default=d.refs, help="reference rows (gold log-prob)")
    ap.add_argument("--refs-em", type=_csv(), default=d.refs_em, help="reference rows that get exact match")
    ap.add_argument("--run-root", default=d.run_root)
    ap.add_argument("--out", default=None, help="default: results/<config name>[-locked]/")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--split", choices=sorted(curve.SPLIT_SETTINGS), default=d.split)
    ap.add_argument(
        "--seeds",
        type=_csv(int),
        default=d.seeds,
        help="training seeds (train.seed) of every learned row; >1: pooled rows",
    )
    ap.add_argument(
        "--learned",
        type=_csv(),
        default=d.learned,
        help="the rows measured with each trained encoder: epr (the dual encoder alone), hybrid (fused with BM25 "
        "by reciprocal rank); exact match for each of them",
    )
    ap.add_argument(
        "--from-rows",
        action="store_true",
        help="redraw curve.json / .md / .png in --out from its rows/ alone (committed per-example rows; no model, "
        "no run root): the tables' figures and paired tests recomputed from the repository",
    )
    ap.add_argument(
        "--import-scores",
        action="append",
        default=[],
        metavar="FILE",
        help="add an `epr cache export` file (e.g. committed labels) to the run root's score cache first",
    )
    return ap


def spec_of(a: argparse.Namespace) -> curve.CurveSpec:
    keep = {k: v for k, v in vars(a).items() if k != "from_rows"}
    return curve.CurveSpec(**keep)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    ap = build_parser(prog)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not a.from_rows:
        curve.run_curve(spec_of(a).resolve())
        return 0
    # --from-rows: the folder's own run (its config, --set and split), read back from the command it recorded
    if a.out is None or not (Path(a.out) / "rows").is_dir():
        ap.error(f"--from-rows needs --out FOLDER holding rows/ (got {a.out})")
    prev = Path(a.out) / "curve.json"
    was = json.loads(prev.read_text()) if prev.exists() else {"info": {}, "rows": []}
    if cmd := was["info"].get("command"):
        rec, _ = ap.parse_known_args(shlex.split(cmd)[1:])
        here = curve.ROOT / "configs" / Path(rec.config).name  # a path recorded on another machine
        a.config, a.set = rec.config if Path(rec.config).exists() else str(here), rec.set
    a.split = was["rows"][0]["split"] if was["rows"] else a.split
    curve.redraw(spec_of(a).resolve(), was)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
