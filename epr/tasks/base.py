"""The Task interface: everything dataset-specific (loading, formatting, answer normalisation, metric)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from epr.config import DataConfig
from epr.reports.stats import seeded_groups
from epr.tasks.rows import field_text, read_table, text_fields
from epr.types import Example, InputError

__all__ = [
    "Task",
    "RawRow",
    "LoadReport",
    "register",
    "get_task",
    "TASKS",
    "split_pool_eval",
    "read_table",
    "field_text",
]

log = logging.getLogger(__name__)
TASKS: dict[str, type[Task]] = {}


def register(name: str) -> Callable[[type[Task]], type[Task]]:
    def deco(cls: type[Task]) -> type[Task]:
        cls.name = name
        TASKS[name] = cls
        return cls

    return deco


def get_task(cfg: DataConfig) -> Task:
    if cfg.task not in TASKS:
        raise ValueError(f"data.task={cfg.task!r} is not a known task; known: {sorted(TASKS)}")
    return TASKS[cfg.task](cfg)


@dataclass
class RawRow:
    """A row as read, before ids are assigned. ``where`` is 'file:line' for error messages."""

    input: str
    output: str
    meta: dict[str, Any]
    where: str


@dataclass
class LoadReport:
    """What loading kept and what it skipped (and why), so nothing is dropped silently."""

    kept: int = 0
    skipped: list[str] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)
    repeated_in_pool: int = 0  # pool rows with the input and output of an earlier pool row (kept)
    eval_in_pool: int = 0  # evaluation rows whose input and output are also a pool row (kept; see Task.load)
    beyond_pool_limit: int = 0  # usable pool rows after the first data.pool_limit ones: not used, by request
    inputs_with_separators: int = 0  # inputs holding the prompt format's tab or newline (kept; see Task.load)
    LOG_EACH: ClassVar[int] = 3  # rows logged one by one per reason; the rest are counted in the summary

    def skip(self, where: str, why: str) -> None:
        self.skipped.append(f"{where}: {why}")
        n = self.reasons[why] = self.reasons.get(why, 0) + 1
        if n <= self.LOG_EACH:
            log.warning("skipping %s: %s", where, why)
        elif n == self.LOG_EACH + 1:
            log.warning("more rows skipped for %r: counted, and summarised when loading ends", why)

    def summary(self) -> str:
        """One line: how many rows were skipped, for which reasons."""
        parts = ", ".join(f"{n} {why}" for why, n in self.reasons.items())
        limit = (
            f", {self.beyond_pool_limit} pool rows left out by data.pool_limit"
            if self.beyond_pool_limit
            else ""
        )
        return (
            f"kept {self.kept} rows, skipped {len(self.skipped)}" + (f" ({parts})" if parts else "") + limit
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "kept": self.kept,
            "skipped": len(self.skipped),
            "skipped_by_reason": dict(self.reasons),
            "skipped_rows": self.skipped[:200],
            "repeated_in_pool": self.repeated_in_pool,
            "eval_in_pool": self.eval_in_pool,
            "beyond_pool_limit": self.beyond_pool_limit,
            "inputs_with_separators": self.inputs_with_separators,
        }


def split_pool_eval(
    rows: Sequence[RawRow], eval_size: int, seed: int, group: Callable[[RawRow], str] | None = None
) -> tuple[list[RawRow], list[RawRow]]:
    """Deterministically move ``eval_size`` rows (whole groups, when ``group`` is given) to the eval part.

    Groups (e.g. SMCalFlow dialogues) never straddle the split, so no dialogue leaks into the pool.
    Both parts keep the original file order.
    """
    keys = [group(r) if group else str(i) for i, r in enumerate(rows)]
    chosen = {keys[i] for i in seeded_groups(keys, eval_size, seed)}
    pool = [r for r, k in zip(rows, keys) if k not in chosen]
    ev = [r for r, k in zip(rows, keys) if k in chosen]
    return pool, ev


class Task:
    """Base class. Subclasses implement ``raw_splits``; formatting and metric have sensible defaults."""

    name = "base"
    hub_name: str | None = None
    # further per-example metrics reported beside exact match: name -> (prediction, gold) -> bool
    extra_metrics: dict = {}
    paper_metric = "em"  # the metric the paper's numbers (evaluation.PAPER) report: "em" or an extra metric
    columns: tuple[
        str, ...
    ] = ()  # the data's other columns the prompt templates name (kept in each row's meta)

    def __init__(self, cfg: DataConfig):
        self.cfg = cfg
        self.report = LoadReport()

    # ---- loading -------------------------------------------------------------------------------
    def groups(self, examples: Sequence[Example]) -> list[str]:
        """Each example's group for ``data.eval_cut=groups`` (rows that must stay on one side of the dev / locked
        cut). A task without groups puts every example in its own."""
        return [str(e.idx) for e in examples]

    def data_files(self) -> list[Path]:
        """The local files :meth:`raw_splits` reads (none when it reads the hub): their content is part of the
        examples stage's key, so a file replaced in place makes the run stale."""
        return []

    def where(self) -> str:
        """The data's source for messages: its files, else the task's name."""
        files = self.data_files()
        return ", ".join(str(f) for f in files) if files else f"task {self.name}"

    def raw_splits(self) -> tuple[list[RawRow], list[RawRow]]:
        raise NotImplementedError

    def load(self) -> tuple[list[Example], list[Example]]:
        """Return (pool, eval) with ``idx`` = position in the split. Empty inputs/outputs are skipped,
        logged and counted in ``self.report`` (they cannot serve as demonstrations or be scored). The whole eval
        split: which part of it is compared (``data.eval_limit`` / ``data.eval_part``) is chosen downstream
        (``epr.reports.stats.eval_part``), so that training never depends on it."""
        pool_raw, eval_raw = self.raw_splits()
        pool = self._finalise(pool_raw, self.cfg.pool_limit)
        ev = self._finalise(eval_raw, None)
        if not pool:
            raise InputError(
                f"{self.where()}: the demonstration pool is empty ({self.report.summary()}); every row needs a "
                f"non-empty {self.cfg.input_field!r} and {self.cfg.output_field!r}"
            )
        if (
            eval_raw and not ev and self.cfg.eval_path
        ):  # a held-out part may be all bad by chance: retrieve says so
            raise InputError(
                f"{self.where()}: none of the {len(eval_raw)} evaluation rows is usable ({self.report.summary()}; "
                f"e.g. {'; '.join(self.report.skipped[-3:])}); every row needs a non-empty "
                f"{self.cfg.input_field!r} and {self.cfg.output_field!r}"
            )
        if self.report.skipped or self.report.beyond_pool_limit:
            log.warning("task %s: %s", self.name, self.report.summary())
        self._check_repeats(pool, ev)
        self._check_separators([*pool, *ev])
        return pool, ev

    def _check_separators(self, rows: Sequence[Example]) -> None:
        """Count (and warn about, naming rows) inputs that hold the default prompt format's separators, a tab
        (between input and answer) or a newline (between demonstrations): kept as they are, but the LM then sees a
        demonstration's boundaries in the wrong place, so the user should know."""
        if type(self).format_demo is not Task.format_demo:
            return  # the task writes its own format
        hits = [str(e.meta.get("source")) for e in rows if "\t" in e.input or "\n" in e.input]
        self.report.inputs_with_separators = len(hits)
        if hits:
            log.warning(
                "task %s: %d of %d inputs hold a tab or a newline, the prompt format's separators (kept; the LM "
                "sees the demonstration's boundaries in the wrong place), e.g. %s",
                self.name,
                len(hits),
                len(rows),
                "; ".join(hits[:3]),
            )

    def _check_repeats(self, pool: Sequence[Example], ev: Sequence[Example]) -> None:
        """Count (and warn about, naming rows) pool rows that repeat an earlier pool row and evaluation rows whose
        input and output are also in the pool: kept as they are (real data sets repeat short commands), but an
        evaluation row with its own answer among the demonstrations inflates the scores, so the user should know."""
        seen: dict[tuple[str, str], str] = {}
        repeats: list[str] = []
        for e in pool:
            k = (e.input, e.output)
            if k in seen:
                repeats.append(f"{e.meta.get('source')} (= {seen[k]})")
            else:
                seen[k] = str(e.meta.get("source"))
        overlap = [
            f"{e.meta.get('source')} (= {seen[(e.input, e.output)]})"
            for e in ev
            if (e.input, e.output) in seen
        ]
        self.report.repeated_in_pool, self.report.eval_in_pool = len(repeats), len(overlap)
        for what, rows, n in (
            ("pool rows repeat an earlier pool row", repeats, len(pool)),
            ("evaluation rows are also in the pool (same input and output)", overlap, len(ev)),
        ):
            if rows:
                log.warning(
                    "task %s: %d of %d %s, e.g. %s", self.name, len(rows), n, what, "; ".join(rows[:3])
                )

    def _finalise(self, rows: Sequence[RawRow], limit: int | None) -> list[Example]:
        out: list[Example] = []
        for i, r in enumerate(rows):
            if limit is not None and len(out) >= limit:
                # the rows past the limit are not used, but every one is accounted for: skipped (unusable,
                # with its reason) or counted as left out by the limit
                for x in rows[i:]:
                    why = self.unusable(x.input, x.output)
                    if why:
                        self.report.skip(x.where, why)
                    else:
                        self.report.beyond_pool_limit += 1
                break
            why = self.unusable(r.input, r.output)
            if why:
                self.report.skip(r.where, why)
                continue
            out.append(Example(len(out), r.input.strip(), r.output.strip(), {**r.meta, "source": r.where}))
        self.report.kept += len(out)
        return out

    def unusable(self, input, output) -> str | None:
        """Why a row cannot be an example (None when it can): an empty input or output, or an output holding the
        end marker (generation ends there, so such a gold answer could never be matched, and as a demonstration
        it would end mid-answer). The one rule for data files, the hub and :meth:`epr.api.PromptRetriever.add`."""
        if not isinstance(input, str) or not input.strip():
            return "empty input"
        if not isinstance(output, str) or not output.strip():
            return "empty output"
        if self.stop in output.strip():
            return f"output holds the end marker {self.stop!r} (the prompt format ends an answer there)"
        return None

    def rows_from_file(
        self,
        path: str | Path,
        input_field: str = "input",
        output_field: str = "output",
        meta_fields: Sequence[str] = (),
        hint: str = "",
    ) -> list[RawRow]:
        """The file's rows; ``hint`` ends the message of a missing column or field (where the names come from)."""
        out = []
        for row, where in read_table(path, input_field, output_field, hint):
            meta = {k: row[k] for k in ("id", *meta_fields) if k in row}
            out.append(RawRow(row[input_field], row[output_field], meta, where))
        return out

    def rows_from_hub(
        self, split: str, input_field: str, output_field: str, config: str | None = None
    ) -> list[RawRow]:
        if self.hub_name is None:
            raise InputError(f"task {self.name}: no data_dir given and no hub dataset known")
        try:
            ds = self.load_hub(config, split)
        except Exception as e:  # offline, or the hub layout changed
            raise InputError(
                f"task {self.name}: could not load {self.hub_name!r} split {split!r} from the hub ({e}); "
                f"pass data.data_dir=<folder> with local files instead"
            ) from e
        missing = [c for c in (input_field, output_field) if c not in ds.column_names]
        if missing:
            raise InputError(
                f"task {self.name}: {self.hub_name!r} split {split!r} has no column(s) {missing}; its columns are "
                f"{ds.column_names} (the hub layout may have changed: pass data.data_dir=<folder> with local files)"
            )
        out = []
        for i, r in enumerate(ds):
            where = f"{self.hub_name}[{split}]#{i}"
            t = text_fields(
                r, (input_field, output_field), where
            )  # as file rows: text, numbers as JSON writes
            out.append(RawRow(t[input_field], t[output_field], {}, where))
        return out

    def load_hub(self, config: str | None, split: str):
        """``split`` of the hub dataset at ``data.hub_revision``. Unpinned, the hub's newest version is read and
        the run's key cannot see a later update: say so."""
        from datasets import load_dataset

        rev = self.cfg.hub_revision
        if rev is None:
            log.warning(
                "task %s: reading %s from the hub unpinned; set data.hub_revision=<commit> so that a hub update "
                "makes this run stale instead of mixing versions",
                self.name,
                self.hub_name,
            )
        return load_dataset(self.hub_name, config, split=split, revision=rev)

    def data_path(self, *parts: str) -> Path:
        assert self.cfg.data_dir is not None
        p = Path(self.cfg.data_dir).joinpath(*parts)
        if not p.exists():
            raise FileNotFoundError(f"task {self.name}: expected {p} (data.data_dir={self.cfg.data_dir})")
        return p

    # ---- prompting -----------------------------------------------------------------------------
    def format_demo(self, ex: Example) -> str:
        """A demonstration as it appears in the prompt; ends with a newline."""
        return f"{ex.input}\t{ex.output}\n"

    def format_query(self, x: str) -> str:
        """The test input, right before the answer."""
        return f"{x}\t"

    def format_target(self, y: str) -> str:
        """The scored/generated answer text (the newline ends it)."""
        return f"{y}\n"

    stop = "\n"

    # ---- metric --------------------------------------------------------------------------------
    def normalize(self, y: str) -> str:
        return " ".join(y.split())

    def skeleton(self, y: str) -> str | None:
        """The output's structure without its content words (a parse's skeleton), where the task knows one; two
        outputs with the same skeleton differ only in the text they fill in. ``scripts/curve_diagnose.py`` asks
        whether a prompt holds a demonstration with the gold's skeleton. None: the task knows no structure."""
        return None

    def is_correct(self, pred: str, gold: str) -> bool:
        return self.normalize(pred) == self.normalize(gold)

    def metrics(self, pred: str, gold: str) -> dict[str, bool]:
        """The extra metrics of one prediction (``extra_metrics``), by name."""
        return {k: bool(f(pred, gold)) for k, f in self.extra_metrics.items()}
