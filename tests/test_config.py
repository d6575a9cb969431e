import pytest

from epr.config import load_config


def test_defaults_and_overrides(tmp_path):
    (tmp_path / "base.yaml").write_text("candidates:\n  L: 30\n")
    (tmp_path / "child.yaml").write_text("inherit: base.yaml\nname: x\nlabels:\n  k_pos: 4\n")
    cfg = load_config(
        [tmp_path / "child.yaml"], ["candidates.backend=rank_bm25", "retrieve.retrievers=bm25,epr"]
    )
    assert (cfg.name, cfg.candidates.L, cfg.labels.k_pos) == ("x", 30, 4)
    assert cfg.candidates.backend == "rank_bm25" and cfg.retrieve.retrievers == ("bm25", "epr")


@pytest.mark.parametrize(
    "override,match",
    [
        ("candidates.Lx=3", r"unknown key\(s\) \['Lx'\]"),
        ("candidates.view=title", "not one of"),
        ("candidates.L=abc", "expected an integer"),
        ("ragsys.lambda_d=1.5", r"lambda_d=1.5 must be in \[0, 1\]"),
        ("labels.k_pos=50", "must be <= candidates.L"),
    ],
)
def test_bad_values_are_named(override, match):
    with pytest.raises(ValueError, match=match):
        load_config([], [override])


@pytest.mark.parametrize(
    "bad,msg",
    [
        ("bm26", "unknown retriever 'bm26'"),
        ("epr+diversity", "unknown retriever"),
        ("bm25+div", "needs a dense first stage"),
    ],
)
def test_retriever_names_checked_at_load(bad, msg):
    with pytest.raises(ValueError, match=msg):
        load_config([], [f"retrieve.retrievers=epr,{bad}"])
    ok = load_config([], ["retrieve.retrievers=random,bm25,sbert+div,epr+div+bias,lm-oracle"])
    assert ok.retrieve.retrievers == ("random", "bm25", "sbert+div", "epr+div+bias", "lm-oracle")
