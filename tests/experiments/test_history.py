"""The ledger read from git (issue 75, item 2): each attack an audit tried on a declaration is refused by the history
check, and the untouched history passes. A throwaway repository with commits at chosen dates plays each attack; the
committed tree is checked last."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from epr.experiments import history

ROOT = Path(__file__).resolve().parents[2]


def git(repo: Path, *args: str, when: str | None = None) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")  # fmt: skip
    if when:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = f"{when}:00 +0000"
    return subprocess.run(
        ["git", "-C", str(repo), *args], env=env, capture_output=True, text=True, check=True
    ).stdout


def commit(repo: Path, when: str, msg: str = "c") -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", msg, when=when)
    return git(repo, "rev-parse", "--short=7", "HEAD").strip()


def declare(folder: Path, **over) -> None:
    d = {
        "title": "a look",
        "dataset": "mtop",
        "split": "locked",
        "status": "decisive",
        "date": "2026-11-27 10:00",
        "kind": "other",
        "outcome": "it held",
        "preregistration": "PLAN.md",
    }
    d.update(over)
    d = {k: v for k, v in d.items() if v is not None}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "experiment.yaml").write_text(yaml.safe_dump(d, sort_keys=False))


def rows(folder: Path, name: str = "bm25.json", text: str = '{"per_query": [1, 2]}') -> None:
    (folder / "rows").mkdir(parents=True, exist_ok=True)
    (folder / "rows" / name).write_text(text)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    git(tmp_path, "init", "-q")
    (tmp_path / "results").mkdir()
    return tmp_path


def problems(repo: Path) -> list[str]:
    results = repo / "results"
    return history.problems(history.read(results), history.load_all(results))


def honest(repo: Path) -> Path:
    """A look done right: the plan committed at 09:00, the declaration dated 10:00, the rows committed at 10:05."""
    f = repo / "results" / "look"
    f.mkdir(parents=True)
    (f / "PLAN.md").write_text("the tests, fixed before the run\n")
    commit(repo, "2026-11-27 09:00", "plan")
    declare(f)
    rows(f)
    commit(repo, "2026-11-27 10:05", "rows")
    return f


def test_an_honest_look_passes_and_is_git_dated(repo):
    honest(repo)
    assert problems(repo) == []
    results = repo / "results"
    h = history.read(results)
    (lk,) = history.ledger(h, history.load_all(results))["mtop"]
    assert h.date(lk.look) == "2026-11-27 10:05" and h.date(lk.prereg) == "2026-11-27 09:00"
    assert lk.amendments == []


def test_a_backdated_look_is_refused(repo):
    """The declaration says 21:59, before the pre-registration rule; git says the rows came at 22:30, with no
    pre-registration: refused by git's date, whatever the folder says."""
    f = repo / "results" / "look"
    declare(f, date="2026-11-26 21:59", preregistration=None)
    rows(f)
    commit(repo, "2026-11-26 22:30")
    assert any("after 2026-11-26 22:00 and has no pre-registration" in p for p in problems(repo))


def test_a_date_after_or_long_before_the_rows_is_refused(repo):
    f = honest(repo)
    declare(f, date="2026-11-27 11:00")  # an hour after the rows were committed
    commit(repo, "2026-11-27 12:00")
    assert any("declares date 2026-11-27 11:00, after its first locked rows" in p for p in problems(repo))
    declare(f, date="2026-11-25 10:00")  # two days before them
    commit(repo, "2026-11-27 12:01")
    assert any("more than 24 h before" in p for p in problems(repo))


def test_a_split_relabelled_dev_is_refused(repo):
    f = honest(repo)
    declare(f, split="dev")
    commit(repo, "2026-11-27 12:00", "relabel")
    (p,) = problems(repo)
    assert "declares split 'dev'" in p and "declared 'locked'" in p


def test_a_preregistration_committed_after_its_rows_is_refused(repo):
    f = repo / "results" / "look"
    declare(f, date="2026-11-27 10:00")
    (f / "PLAN.md").write_text("written before, committed after\n")
    rows(f)
    git(repo, "add", str(f / "rows"))
    git(repo, "commit", "-q", "-m", "rows first", when="2026-11-27 10:05")
    commit(repo, "2026-11-27 10:20", "plan after")
    assert any("a pre-registration counts only if committed before the rows" in p for p in problems(repo))


def test_an_amendment_after_the_look_must_be_declared(repo):
    f = honest(repo)
    (f / "PLAN.md").write_text("the tests, fixed before the run\namended after the rows\n")
    sha = commit(repo, "2026-11-27 11:00", "amend")
    (p,) = problems(repo)
    assert f"changed in {sha}" in p and "after_look" in p
    declare(f, after_look=[f"{sha} (2026-11-27 11:00): a line appended; the tests unchanged"])
    commit(repo, "2026-11-27 11:01")
    assert problems(repo) == []


def test_an_amendment_in_the_commit_of_the_rows_counts_as_after_the_look(repo):
    f = repo / "results" / "look"
    f.mkdir(parents=True)
    (f / "PLAN.md").write_text("the tests\n")
    commit(repo, "2026-11-27 09:00")
    declare(f)
    rows(f)
    (f / "PLAN.md").write_text("the tests, rewritten as the rows were seen\n")
    sha = commit(repo, "2026-11-27 10:05")
    assert any(f"changed in {sha}" in p for p in problems(repo))


def test_a_copied_reference_row_belongs_to_the_look_that_made_it(repo):
    honest(repo)
    g = repo / "results" / "later"
    (g / "PLAN.md").parent.mkdir(parents=True)
    (g / "PLAN.md").write_text("a later plan\n")
    commit(repo, "2026-11-28 09:00")
    declare(g, date="2026-11-28 10:00")
    rows(g)  # the first look's BM25 row, copied
    rows(g, "epr.json", '{"per_query": [3, 4]}')
    commit(repo, "2026-11-28 10:05")
    results = repo / "results"
    h = history.read(results)
    lks = history.ledger(h, history.load_all(results))["mtop"]
    assert [lk.exp.name for lk in lks] == ["look", "later"]
    assert h.date(lks[1].look) == "2026-11-28 10:05"  # not the copied row's 2026-11-27
    assert problems(repo) == []


def test_declared_dates_out_of_git_order_are_refused(repo):
    honest(repo)
    g = repo / "results" / "later"
    g.mkdir(parents=True)
    (g / "PLAN.md").write_text("p\n")
    commit(repo, "2026-11-27 09:30")
    declare(g, date="2026-11-27 09:55")  # declared before the first look's 10:00, committed after it
    rows(g, "epr.json", "{}")
    commit(repo, "2026-11-27 10:06")
    assert any("look 1 is look by git" in p for p in problems(repo))


def test_a_checkout_without_git_says_so(tmp_path):
    (tmp_path / "results").mkdir()
    with pytest.raises(history.NoHistory):
        history.read(tmp_path / "results")


def test_the_committed_results_agree_with_git():
    """The real tree: every locked folder's date, split and pre-registration as git has them (CI reads the
    history; where there is none to read, this says why)."""
    try:
        h = history.read(ROOT / "results")
    except history.NoHistory as e:
        pytest.skip(f"no git history to read: {e}")
    exps = history.load_all(ROOT / "results")
    assert history.problems(h, exps) == []
    led = history.ledger(h, exps)
    assert len(led["mtop"]) >= 11 and len(led["break"]) >= 5 and len(led["smcalflow"]) >= 7
    first = led["mtop"][0]
    assert first.exp.name == "mtop-curve-locked" and h.date(first.look) == "2026-11-24 12:16"


def test_a_locked_row_edited_after_its_commit_is_refused(repo):
    f = honest(repo)
    rows(f, text='{"per_query": [1, 3]}')  # one example changed
    sha = commit(repo, "2026-11-27 12:00", "edit")
    (p,) = problems(repo)
    assert f"rows/bm25.json was changed in {sha}" in p and "never edited" in p
