"""What every stage gets: the resolved config, the run directory, the process layout and cached loaders."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path

from epr.artifacts import read_jsonl
from epr.cache import read_manifest
from epr.config import ExperimentConfig, PromptConfig
from epr.types import ConfigError, Example, Ranking, UpstreamError

__all__ = ["Context", "Dist", "Round"]

log = logging.getLogger(__name__)


@dataclass
class Dist:
    """Process layout. ``from_env`` reads what ``accelerate launch`` (or torchrun) sets."""

    rank: int = 0
    world: int = 1
    _state: object | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls) -> Dist:
        import os

        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from accelerate import PartialState
            from accelerate.utils import parse_flag_from_env

            # ACCELERATE_USE_CPU: several CPU processes (torchrun) form one group instead of each being "main"
            st = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"))
            return cls(st.process_index, st.num_processes, st)
        return cls()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self._state is not None:
            self._state.wait_for_everyone()


COMPARING_STAGES = ("retrieve", "rerank", "prompts", "predict", "evaluate")


@dataclass(frozen=True)
class Round:
    """Where a context stands among its run's training rounds: the one reader of ``candidates.rounds``,
    ``candidates.miner`` and ``candidates.mine_run``. Made once per context (:attr:`Context.this_round`).

    Round 1 of a run mines its candidates with BM25, or with the trained encoder of ``candidates.mine_run`` where
    one is named (an outside run); round r + 1 of the same run re-mines with round r's encoder (``mixed`` when
    ``candidates.miner`` is mixed, else ``retriever``), in ``<run_dir>/rounds/round-r/``."""

    index: int  # this round among the run's in-run rounds: 1 = first, ``total`` = the run's own stages
    total: int  # candidates.rounds
    miner: str  # who mines this round's candidates: bm25, retriever or mixed
    mine_dir: Path | None  # the run folder whose trained encoder mines them; None for BM25
    outside: bool  # mined by candidates.mine_run's encoder (an outside run's round r + 1)
    mine_run: str | None = None  # the name as configured, for messages

    @classmethod
    def of(cls, cfg: ExperimentConfig, index: int, prev_dir: Path | None) -> Round:
        c = cfg.candidates
        if index > 1:
            return cls(index, c.rounds, "mixed" if c.miner == "mixed" else "retriever", prev_dir, False, None)
        if c.mine_run is not None:
            p = Path(c.mine_run)
            if not p.exists() and (Path(cfg.run_root) / p).exists():
                p = Path(cfg.run_root) / p  # a run name under run_root
            return cls(1, c.rounds, c.miner, p, True, c.mine_run)
        return cls(1, c.rounds, "bm25", None, False, None)

    @property
    def remined(self) -> bool:
        """Mined by a trained encoder (this run's previous round or an outside run's), not by BM25 alone."""
        return self.miner in ("retriever", "mixed")

    def outside_identity(self) -> dict:
        """What an outside ``mine_run``'s candidates come from, read from its manifests: its encoder's stage
        fingerprint (``None`` while it is not trained: the candidates stage then refuses to run) and this round's
        number (the mining run's round + 1)."""
        enc, cand = read_manifest(self.mine_dir / "encoder"), read_manifest(self.mine_dir / "candidates")
        return {
            "encoder": None if enc is None else enc.get("fingerprint"),
            "round": (cand or {}).get("round", 1) + 1,
        }

    def number(self) -> int:
        """The training round this context's candidates belong to: 1 for BM25's; an in-run round's index plus the
        rounds of an outside ``mine_run`` under round 1."""
        first = self.outside_identity()["round"] if self.outside else 1
        return first + self.index - 1


@dataclass
class Context:
    cfg: ExperimentConfig
    dist: Dist = field(default_factory=Dist)
    top: str | None = None  # a round sub-run's: the name of the run it is a round of
    index: int | None = None  # a round sub-run's index among its run's rounds (None: the run itself)
    _formats: dict = field(default_factory=dict, repr=False, compare=False)  # prompt(inference) -> its format
    # round r - 1's context, made once: the chain of rounds is walked by every fingerprint of every later round
    _prev: list = field(default_factory=list, repr=False, compare=False)
    # fingerprints of this context's stages up to its encoder, computed once (a round's encoder fingerprint keys
    # every later round; it depends on the config alone, so it cannot change while this context lives)
    round_fps: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        if self.cfg.data.task == "truthfulqa" and self.cfg.prompt != PromptConfig():
            raise ConfigError(
                "config prompt: TruthfulQA's evaluation writes its own prompt format (epr/tasks/qa_format.py, the "
                "same for every compared retriever); remove the prompt section for data.task=truthfulqa"
            )

    @property
    def round(self) -> int:
        """This context's round among its run's in-run rounds (the run's own stages are the last,
        ``candidates.rounds``)."""
        return self.cfg.candidates.rounds if self.index is None else self.index

    @functools.cached_property
    def this_round(self) -> Round:
        """This round: its index, the total, who mines its candidates and from which run folder."""
        prev = self.prev_round()
        return Round.of(self.cfg, self.round, None if prev is None else prev.cfg.run_dir)

    def prev_round(self) -> Context | None:
        """Round r - 1 of this run (``<run_dir>/rounds/round-<r-1>/``), whose trained encoder mines this round's
        candidates; ``None`` in round 1. Made once. Every round shares the run's config (its run root, so its score
        cache) but its name, and the process layout."""
        import dataclasses

        r = self.round
        if r <= 1:
            return None
        if not self._prev:
            top = self.top or self.cfg.name
            cfg = dataclasses.replace(self.cfg, name=f"{top}/rounds/round-{r - 1}")
            self._prev.append(Context(cfg, self.dist, top, r - 1))
        return self._prev[0]

    def rounds(self) -> list[Context]:
        """Every round of this run, first to last (this one last)."""
        out: list[Context] = [self]
        while (p := out[0].prev_round()) is not None:
            out.insert(0, p)
        return out

    def stage_dir(self, stage: str) -> Path:
        """``<run_dir>/<stage>``; the comparing stages of a ``data.eval_part=locked`` run go under
        ``<run_dir>/locked/`` so that the dev part's outputs stay as they are (training is shared: it never
        depends on the compared part)."""
        if self.cfg.data.eval_part == "locked" and stage in COMPARING_STAGES:
            return self.cfg.run_dir / "locked" / stage
        return self.cfg.run_dir / stage

    def sub_run(self, name: str) -> Context:
        """A sub-run declared in the stage graph: ``dr-bm25`` is this run with BM25-ranked labels (no LM scoring,
        SPEC 2.6), in ``<run_dir>/dr-bm25/``."""
        import dataclasses

        if name != "dr-bm25":
            raise ValueError(f"unknown sub-run {name!r}")
        cfg = self.cfg
        sub = dataclasses.replace(
            cfg,
            name=f"{cfg.name}/dr-bm25",
            labels=dataclasses.replace(cfg.labels, source="bm25"),
            # BM25 candidates (round 1) even in a re-mining run: BM25-ranked labels of BM25's candidates
            candidates=dataclasses.replace(cfg.candidates, miner="bm25", mine_run=None, rounds=1),
        )
        return Context(sub)  # one process: the sub-run is a step of the main process's stage

    def encoder_dir(self, retriever: str) -> Path | None:
        """The trained dual encoder a retriever uses: this run's (``epr``, ``hybrid``), the DR-BM25 sub-run's, or
        none."""
        if retriever in ("epr", "hybrid"):
            return self.stage_dir("encoder") / "model"
        if retriever == "dr-bm25":
            return self.sub_run("dr-bm25").stage_dir("encoder") / "model"
        return None

    @functools.cached_property
    def task(self):
        from epr.tasks import get_task

        task = get_task(self.cfg.data)
        task.columns = (
            self.cfg.prompt.columns()
        )  # your data's columns the prompt templates name: kept as meta
        return task

    def prompt(self, inference: bool = False):
        """The run's prompt format (:class:`epr.prompt.PromptFormat`, its ``prompt`` section over the task):
        for the scoring LM (labels, the LM oracle) or, with ``inference``, the inference LM (select, prompts,
        generation, the quality bias). Chat mode renders through that LM's own chat template."""
        from epr.prompt import PromptFormat

        if inference in self._formats:
            return self._formats[inference]
        tok = None
        if self.cfg.prompt.chat:
            from epr.lm.models import load_tokenizer_for

            tok = load_tokenizer_for(self.cfg.models, inference=inference)
        fmt = self._formats[inference] = PromptFormat(self.task, self.cfg.prompt, tok)
        return fmt

    def _needs(self, stage: str, path: Path) -> Path:
        if not path.exists() or not (self.stage_dir(stage) / "manifest.json").exists():
            raise UpstreamError(
                f"{path}: the run {self.cfg.run_dir} has no finished {stage!r} stage yet; run the pipeline first: "
                f"`epr run --until {stage}` with the same -c/--set (see `epr status`)"
            )
        return path

    def examples(self, split: str) -> list[Example]:
        path = self._needs("examples", self.stage_dir("examples") / f"{split}.jsonl")
        return [Example.from_json(r) for r in read_jsonl(path)]

    def rankings(self, stage: str, name: str) -> list[Ranking]:
        return [Ranking.from_json(r) for r in read_jsonl(self._needs(stage, self.stage_dir(stage) / name))]
