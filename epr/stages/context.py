"""What every stage gets: the resolved config, the run directory, the process layout and cached loaders."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path

from epr.artifacts import read_jsonl
from epr.config import ExperimentConfig
from epr.types import Example, Ranking

__all__ = ["Context", "Dist"]

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

            st = PartialState()
            return cls(st.process_index, st.num_processes, st)
        return cls()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self._state is not None:
            self._state.wait_for_everyone()


@dataclass
class Context:
    cfg: ExperimentConfig
    dist: Dist = field(default_factory=Dist)

    def stage_dir(self, stage: str) -> Path:
        return self.cfg.run_dir / stage

    @functools.cached_property
    def task(self):
        from epr.tasks import get_task

        return get_task(self.cfg.data)

    def examples(self, split: str) -> list[Example]:
        return [Example.from_json(r) for r in read_jsonl(self.stage_dir("examples") / f"{split}.jsonl")]

    def rankings(self, stage: str, name: str) -> list[Ranking]:
        return [Ranking.from_json(r) for r in read_jsonl(self.stage_dir(stage) / name)]
