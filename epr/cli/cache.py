"""``epr cache export|import FILE``: a run root's LM score stores (scores, greedy flags, the predict stage's
generations) as one portable file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub, common) -> None:
    sc = sub.add_parser(
        "cache",
        parents=[common],
        help="move LM scores and generations between run roots or machines: export the run root's stores to one "
        "file, import one",
    )
    sc.add_argument("action", choices=("export", "import"))
    sc.add_argument("file", help="the .json.gz file to write (export) or read (import)")
    sc.add_argument(
        "--this-lm",
        action="store_true",
        help="export: only the store of this config's scoring LM (model, dtype, forward), not every store",
    )
    sc.add_argument(
        "--this-run",
        action="store_true",
        help="export: only the scores of this config's candidates (its labels; needs its candidates stage), "
        "from its scoring LM's store",
    )
    sc.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="EARLIER",
        help="export: leave out the scores an earlier export already carries (repeatable), so a long run moved "
        "between machines in stages commits each stage's new scores once; import every file in turn",
    )


def run(ctx, args: argparse.Namespace) -> int:
    """``epr cache export|import FILE``: the run root's LM score stores as one portable file (labels scored on one
    machine are not scored again on another; each score is served only under its own model/dtype/forward key)."""
    import json

    from epr.lm.factory import accepted_stores, scoring_key
    from epr.lm.score_cache import export_scores, import_scores

    root = Path(ctx.cfg.run_root) / ".cache" / "scores"
    if args.skip and args.action != "export":
        from epr.types import InputError

        raise InputError("epr cache import: --skip is for export (import each stage's file in turn)")
    if args.action == "export":
        only = None
        if args.this_run:  # this config's pairs only (needs its candidates), in its LM's store
            from epr.stages.scores import run_pair_keys

            only = run_pair_keys(ctx)
        key = scoring_key(ctx.cfg) if args.this_lm or args.this_run else None
        if (
            args.this_run
        ):  # its labels' scores, from where the run read them: the stores it accepts, then its own
            key = [json.loads((d / "KEY.json").read_text()) for d in accepted_stores(ctx.cfg)] + [key]
        counts = export_scores(root, args.file, key, only, args.skip)
        for store, n in counts.items():
            sys.stdout.write(f"exported {n} scores of {root / store}\n")
        sys.stdout.write(f"wrote {args.file} (epr cache import {args.file} on the other machine)\n")
        return 0
    got = import_scores(root, args.file)
    for store, c in got.items():
        sys.stdout.write(
            f"{root / store}: {c['added']} added, {c['kept']} already held, {c['conflicts']} conflicts\n"
        )
    accepted = {
        d.name for d in accepted_stores(ctx.cfg)
    }  # scoring.accept_devices: read by this config's labels
    from epr.stages.predict import generation_key

    mine = [scoring_key(ctx.cfg), scoring_key(ctx.cfg, inference=True)]
    mine.append(generation_key(ctx.cfg, ctx.prompt(inference=True).stop))
    for line in unread_stores(root, [s for s in got if s not in accepted], mine):
        sys.stdout.write(line + "\n")
    return 0


def unread_stores(root: Path, stores: list[str], mine: list[dict]) -> list[str]:
    """A note for each imported store that no run of this config reads: its key is neither this config's scoring
    LM's nor its inference LM's (scores, greedy flags, generations) on this machine (another device, dtype or batch layout: bf16 scores depend on
    them), with the fields that differ, so an import that will not save any LM work says so instead of passing
    silently."""
    import json

    from epr.cache import fingerprint
    from epr.lm.factory import LAYOUT_FIELDS, key_diff, nearest_key

    def computation(key: dict) -> str:
        """A greedy-flag store reads as its scores' computation; a generation store as its settings', whichever
        decoder the run takes (the lean one also keeps the gold log-prob)."""
        drop = {"gold_in_generation"} | ({"quantity"} if key.get("quantity") == "greedy_match" else set())
        return fingerprint({f: v for f, v in key.items() if f not in drop})

    here = {computation(k) for k in mine}
    out = []
    for store in stores:
        key = json.loads((root / store / "KEY.json").read_text(encoding="utf-8"))
        if computation(key) in here:
            continue
        near = nearest_key(key, mine)
        differ = {f for f in set(near) | set(key) if near.get(f) != key.get(f)}
        hint = ""
        if near is mine[0] and differ <= set(LAYOUT_FIELDS):  # the labels' LM, another device or batch layout
            hint = (
                f"; its labels are read by a run with --set 'scoring.accept_devices=[{key.get('device')}]' "
                "(they round as that device computed them)"
            )
        out.append(
            f"note: this config's runs will not read {root / store} ({key_diff(key, near)}): a score is served "
            "only to the computation that made it (epr.lm.factory.scoring_key): a run with those settings, on such "
            f"a device, reads it{hint}"
        )
    return out
