"""`epr experiment ACTION` takes its folders before or after the options, by path or by name under --results
(issue 76's crack: `epr experiment check --results R F` refused F)."""

from pathlib import Path

import pytest

from epr.cli import main

RESULTS = Path(__file__).resolve().parents[2] / "results"


@pytest.mark.parametrize(
    "argv",
    [
        ["experiment", "check", "--results", str(RESULTS), "mtop-default-recipe"],
        ["experiment", "check", "mtop-default-recipe", "--results", str(RESULTS)],
        ["experiment", "check", str(RESULTS / "mtop-default-recipe")],
    ],
)
def test_folders_before_or_after_the_options(argv, capsys):
    assert main(argv) == 0
    assert "1 of 1 folders recompute" in capsys.readouterr().out


def test_an_unknown_option_is_still_refused(capsys):
    with pytest.raises(SystemExit) as e:
        main(["experiment", "check", "--results", str(RESULTS), "--bogus", "mtop-default-recipe"])
    assert e.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err
