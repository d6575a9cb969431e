"""Semantic-parsing tasks: MTOP, BREAK (QDMR), SMCalFlow, the packaged demo set, your own JSONL/CSV,
and TruthfulQA as (question, answer) pairs."""

from __future__ import annotations

import json
import re
from pathlib import Path

from epr.artifacts import read_jsonl_lines
from epr.tasks.base import RawRow, Task, field_text, register, split_pool_eval
from epr.tasks.qa_format import answer_text, demo_text, query_text
from epr.tasks.qdmr_lf import lf_match
from epr.tasks.qdmr_steps import UnparsableQDMR, operator_of, parse_steps
from epr.types import InputError

__all__ = ["MTOP", "Break", "SMCalFlow", "Demo", "Generic", "TruthfulQA"]

DEMO_DIR = Path(__file__).resolve().parent.parent / "data"


def bracket_skeleton(y: str) -> str:
    """A bracketed parse's labels (``[IN:X``, ``[SL:Y``, ``]``) without the slot text (MTOP, the demo set)."""
    return " ".join(t for t in y.split() if t.startswith("[") or t == "]" or re.fullmatch(r"\)+|\(\S+", t))


@register("mtop")
class MTOP(Task):
    """MTOP English: pool = train (15,667), eval = validation (2,235). Metric: exact match after whitespace
    normalisation of the decoupled logical form."""

    hub_name = "iohadrubin/mtop"

    def data_files(self):
        if not self.cfg.data_dir:
            return []
        return [Path(self.cfg.data_dir) / "mtop" / f"mtop_en.{s}.jsonl" for s in ("train", "validation")]

    def raw_splits(self):
        if self.cfg.data_dir:
            return (
                self.rows_from_file(self.data_path("mtop", "mtop_en.train.jsonl")),
                self.rows_from_file(self.data_path("mtop", "mtop_en.validation.jsonl")),
            )
        return (
            self.rows_from_hub("train", "question", "logical_form"),
            self.rows_from_hub("validation", "question", "logical_form"),
        )

    def skeleton(self, y: str) -> str:
        return bracket_skeleton(y)


@register("break")
class Break(Task):
    """BREAK QDMR. The train split is not available offline, so the labelled dev split (7,760) is split
    deterministically into a pool and ``data.eval_size`` held-out questions. Metrics: normalised exact match
    over QDMR steps (NEM-style: lower-case, collapsed whitespace, per-step) and LF-EM, logical-form exact match
    (``epr.tasks.qdmr_lf``: the paper's BREAK metric, with the one approximation its docstring names)."""

    hub_name = "break_data"
    extra_metrics = {"lf_em": lf_match}
    paper_metric = "lf_em"

    def data_files(self):
        return [Path(self.cfg.data_dir) / "break" / "qdmr.validation.jsonl"] if self.cfg.data_dir else []

    def raw_splits(self):
        if self.cfg.data_dir:
            rows = self.rows_from_file(
                self.data_path("break", "qdmr.validation.jsonl"), meta_fields=("source_dataset",)
            )
        else:
            rows = self.rows_from_hub("validation", "question_text", "decomposition", config="QDMR")
        return split_pool_eval(rows, self.cfg.eval_size, self.cfg.split_seed)

    def normalize(self, y: str) -> str:
        steps = [" ".join(s.lower().split()) for s in y.split(";")]
        steps = [re.sub(r"\s*#\s*(\d+)", r" #\1", s).strip() for s in steps]
        return " ; ".join(s for s in steps if s)

    def skeleton(self, y: str) -> str:
        """Each step's QDMR operator and the steps it refers to (``select ; filter #1 ; aggregate #2``); a step
        whose operator cannot be identified is ``?``."""
        out = []
        for step in parse_steps(y):
            try:
                op = operator_of(step)
            except UnparsableQDMR:
                op = "?"
            out.append(" ".join([op, *re.findall(r"#\d+", step)]))
        return " ; ".join(out)


@register("smcalflow")
class SMCalFlow(Task):
    """SMCalFlow 2.0. Only validation is available offline: it is split by *dialogue* into pool and eval
    (no dialogue on both sides). Turns flagged ``skip`` by the dataset authors are left out and counted.
    Metric: exact match of the lispress string after whitespace normalisation (the string-EM variant, not the
    dataflow library's program-equivalence EM)."""

    hub_name = "iohadrubin/smcalflow"

    def data_files(self):
        if not self.cfg.data_dir:
            return []
        return [Path(self.cfg.data_dir) / "smcalflow" / "smcalflow2.validation.jsonl.gz"]

    def raw_splits(self):
        path = self.data_path("smcalflow", "smcalflow2.validation.jsonl.gz") if self.cfg.data_dir else None
        if path is None:
            rows = self.rows_from_hub("validation", "user_utterance", "lispress")
            return split_pool_eval(rows, self.cfg.eval_size, self.cfg.split_seed)
        rows = []
        for r in self.rows_from_file(path, meta_fields=("dialogue_id", "skip")):
            if (
                "dialogue_id" not in r.meta
            ):  # the split keeps dialogues whole, so every turn must name its own
                raise InputError(
                    f"{r.where}: missing field 'dialogue_id' (the dialogue this turn belongs to)"
                )
            if r.meta.get("skip"):
                self.report.skip(r.where, "turn flagged skip=true by the dataset")
                continue
            rows.append(r)
        return split_pool_eval(
            rows, self.cfg.eval_size, self.cfg.split_seed, group=lambda r: r.meta["dialogue_id"]
        )

    def groups(self, examples):
        """The turn's dialogue: ``data.eval_cut=groups`` keeps each dialogue's turns on one side of dev / locked."""
        missing = [e for e in examples if "dialogue_id" not in e.meta]
        if missing:
            raise InputError(
                f"{self.where()}: data.eval_cut=groups needs each turn's dialogue_id; "
                f"{missing[0].meta.get('source', f'eval row {missing[0].idx}')} has none"
            )
        return [str(e.meta["dialogue_id"]) for e in examples]

    def skeleton(self, y: str) -> str:
        """The lispress program's function heads and closing parentheses, without string and number arguments:
        ``(Yield (Event.attendees (FindEvent ... )))``."""
        y = re.sub(r'"(?:[^"\\]|\\.)*"', " ", y)  # string literals (which may hold parentheses)
        return " ".join(re.findall(r"\(\s*[^\s()]+|\)", y))


@register("demo")
class Demo(Task):
    """The packaged demo set (a small smart-home command parser written for this project, CC0).
    Ships its own pool/eval split: ``epr/data/demo.{pool,eval}.jsonl``."""

    def data_files(self):
        root = Path(self.cfg.data_dir) if self.cfg.data_dir else DEMO_DIR
        return [root / "demo.pool.jsonl", root / "demo.eval.jsonl"]

    def raw_splits(self):
        root = Path(self.cfg.data_dir) if self.cfg.data_dir else DEMO_DIR
        return (self.rows_from_file(root / "demo.pool.jsonl"), self.rows_from_file(root / "demo.eval.jsonl"))

    def skeleton(self, y: str) -> str:
        return bracket_skeleton(y)


@register("jsonl")
class Generic(Task):
    """Your own data: a JSONL or CSV/TSV file with an input and an output column (names set by
    ``data.input_field`` / ``data.output_field``). With ``data.eval_path`` that file is the evaluation set;
    otherwise ``data.eval_size`` rows are held out deterministically."""

    def data_files(self):
        return [Path(p) for p in (self.cfg.path, self.cfg.eval_path) if p]

    def raw_splits(self):
        if not self.cfg.path:
            raise InputError("task jsonl: data.path is not set; set data.path=<your file.jsonl|.csv|.tsv>")
        c = self.cfg
        for key, p in (("data.path", c.path), ("data.eval_path", c.eval_path)):
            if p and not Path(p).exists():  # named with its setting, and where a relative path was looked for
                where = (
                    ""
                    if Path(p).is_absolute()
                    else f" (looked for {Path(p).resolve()}: a relative path is read from the current folder, "
                    "not from the config file's)"
                )
                raise InputError(f"{key} {p}: no such file{where}")
        hint = (
            f"; name your columns with data.input_field / data.output_field (now {c.input_field!r} / "
            f"{c.output_field!r}), e.g. --set data.input_field=question"
        )
        cols = self.columns  # the columns the prompt templates name, kept in each row's meta
        rows = self.rows_from_file(c.path, c.input_field, c.output_field, cols, hint=hint)
        if c.eval_path:
            return rows, self.rows_from_file(c.eval_path, c.input_field, c.output_field, cols, hint=hint)
        return split_pool_eval(rows, min(self.cfg.eval_size, len(rows) // 5), self.cfg.split_seed)


def _answer_rows(r: dict, meta: dict, where: str) -> list[RawRow]:
    """One (question, correct answer) row per correct answer of a TruthfulQA question; the question and every answer
    as text (:func:`field_text`), ``correct_answers`` a list (a bare string would be split into letters)."""
    answers = r["correct_answers"]
    if not isinstance(answers, list):
        raise InputError(
            f"{where}: field 'correct_answers' is {type(answers).__name__} ({json.dumps(answers)[:60]}); expected "
            'a list of answer texts, e.g. ["Nothing happens"]'
        )
    question = field_text(r["question"], where, "question")
    return [
        RawRow(question, field_text(a, where, f"correct_answers[{j}]"), meta, where)
        for j, a in enumerate(answers)
    ]


@register("truthfulqa")
class TruthfulQA(Task):
    """TruthfulQA as (question, correct answer) pairs for the retrieval pipeline; split by question, so no
    question has answers on both sides. The RAGSys evaluation (MC1/MC2/MC3, DPO) is ``epr truthfulqa``."""

    hub_name = "truthful_qa"
    stop = "\n\n"

    def data_files(self):
        return (
            [Path(self.cfg.data_dir) / "truthfulqa" / "truthfulqa.2021-10.jsonl"] if self.cfg.data_dir else []
        )

    def raw_splits(self):
        if self.cfg.data_dir:
            path = self.data_path("truthfulqa", "truthfulqa.2021-10.jsonl")
            rows = [
                row
                for where, r in read_jsonl_lines(path, required=("question", "correct_answers"))
                for row in _answer_rows(r, {"id": r.get("id")}, where)
            ]
        else:
            ds = self.load_hub("generation", "validation")
            rows = [row for i, r in enumerate(ds) for row in _answer_rows(r, {}, f"{self.hub_name}#{i}")]
        return split_pool_eval(rows, self.cfg.eval_size, self.cfg.split_seed, group=lambda r: r.input)

    # the RAGSys evaluation's prompt format (epr.tasks.qa_format): both judge the same prompts
    def format_demo(self, ex):
        return demo_text(ex.input, ex.output)

    def format_query(self, x):
        return query_text(x)

    def format_target(self, y):
        return answer_text(y) + self.stop
