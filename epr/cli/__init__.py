"""The ``epr`` command: :mod:`epr.cli.app` parses and dispatches (its docstring is ``epr --help``); each command
group has its module (``experiment``, ``cache``, ``truthfulqa``, ``inspect``, ``serve``, the learning ``curve`` and
the results ``tools``), and ``ending`` / ``ends`` say what a run served. ``python -m epr.cli`` runs :func:`main`."""

from epr.cli.app import DEMO_CONFIG, build_parser, explain, main

__all__ = ["DEMO_CONFIG", "build_parser", "explain", "main"]
