"""Tasks, registered by name: ``get_task(cfg.data)``."""

from epr.tasks import semparse as _semparse  # noqa: F401  (registers the tasks)
from epr.tasks.base import TASKS, LoadReport, RawRow, Task, get_task, register, split_pool_eval

__all__ = ["TASKS", "LoadReport", "RawRow", "Task", "get_task", "register", "split_pool_eval"]
