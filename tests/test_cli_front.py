"""``epr --help`` shows what a user types (issue 76, item 4): the stage names are off the front page, reached as
``epr stage NAME`` (or ``epr NAME``, which accelerate launches and the recorded commands use)."""

from __future__ import annotations

import re

import pytest

from epr.cli import build_parser, main
from epr.pipeline import STAGES


def test_the_front_page_lists_commands_not_stages(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    listed = re.findall(r"^    (\S+)", out.split("positional arguments:")[1], flags=re.M)
    assert {"demo", "run", "status", "export", "stage"} <= set(listed)
    assert not set(listed) & set(STAGES), listed  # negative control below: the stages are still commands
    assert len(listed) <= 13


def test_a_stage_runs_as_epr_stage_name_and_as_epr_name(capsys):
    assert main(["stage"]) == 0
    out = capsys.readouterr().out
    assert all(f"\n  {n}" in out for n in STAGES)
    assert main(["stage", "no-such-stage"]) == 2
    for argv in (["stage", "scores", "--help"], ["scores", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0 and "run the scores stage" in capsys.readouterr().out
    args = build_parser().parse_args(["scores", "--force"])
    assert args.cmd == "scores" and args.force
