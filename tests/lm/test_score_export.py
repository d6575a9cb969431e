"""Portable LM scores: `epr cache export` on one run root, `epr cache import` on another, and the scores stage there
scores nothing and writes the same file; each score stays under its own computation key."""

import gzip
import json

import pytest

from epr import pipeline
from epr.cache import fingerprint
from epr.cli import main
from epr.lm.score_cache import ScoreCache, export_scores, import_scores, pair_key, read_export
from epr.types import InputError
from tests.stages.test_pipeline import ctx_overrides, make_ctx


def cli(tmp_path, data, lm, *args):
    sets = [x for o in ctx_overrides(tmp_path, data, lm) for x in ("--set", o)]
    return main([*args, *sets])


def test_imported_scores_are_not_scored_again(tmp_path, tiny_task_files, tiny_lm_dir, monkeypatch, capsys):
    a = make_ctx(tmp_path / "a", tiny_task_files, tiny_lm_dir)
    pipeline.run(a, until="scores")
    f = tmp_path / "scores.json.gz"
    assert cli(tmp_path / "a", tiny_task_files, tiny_lm_dir, "cache", "export", str(f), "--this-lm") == 0
    assert cli(tmp_path / "b", tiny_task_files, tiny_lm_dir, "cache", "import", str(f)) == 0
    assert "144 added, 0 already held, 0 conflicts" in capsys.readouterr().out

    from epr.lm.scoring import LMScorer

    def no_lm(*a, **k):
        raise AssertionError("scored a pair the imported cache holds")

    monkeypatch.setattr(LMScorer, "score_pairs", no_lm)
    monkeypatch.setattr(LMScorer, "score_prefixed", no_lm)
    monkeypatch.setattr("epr.stages.scores.build_scorer", no_lm)  # labels served whole load no LM
    b = make_ctx(tmp_path / "b", tiny_task_files, tiny_lm_dir)
    pipeline.run(b, until="scores")
    assert (b.stage_dir("scores") / "scores.jsonl").read_bytes() == (
        a.stage_dir("scores") / "scores.jsonl"
    ).read_bytes()
    # a second import adds nothing
    assert cli(tmp_path / "b", tiny_task_files, tiny_lm_dir, "cache", "import", str(f)) == 0
    assert "0 added, 144 already held, 0 conflicts" in capsys.readouterr().out


def test_scores_stay_under_their_own_key_and_conflicts_are_kept_out(tmp_path):
    root = tmp_path / "a" / "scores"
    fp32, bf16 = {"lm": "m", "dtype": "fp32"}, {"lm": "m", "dtype": "bf16"}
    ScoreCache(root, fp32).put(["x", "y"], ["1", "2"], [-1.0, -2.0], "t")
    ScoreCache(root, bf16).put(["x"], ["1"], [-1.5], "t")
    f = tmp_path / "all.json.gz"
    assert sorted(export_scores(root, f).values()) == [1, 2]
    only = tmp_path / "fp32.json.gz"
    assert list(export_scores(root, only, fp32).values()) == [2]

    dest = tmp_path / "b" / "scores"
    ScoreCache(dest, fp32).put(["x"], ["1"], [-1.2], "t")  # held already, with another value
    got = import_scores(dest, f)
    assert sum(c["conflicts"] for c in got.values()) == 1
    c32, c16 = ScoreCache(dest, fp32), ScoreCache(dest, bf16)
    assert c32.get(["x", "y"], ["1", "2"]) == [-1.2, -2.0]  # the held value is kept, the new one added
    assert c16.get(["x", "y"], ["1", "2"]) == [-1.5, None]  # bf16's store got only bf16's score


def test_generations_travel_under_their_own_key_and_a_changed_text_is_a_conflict(tmp_path):
    """A generation store's entries are ``[prediction, gold log-prob or null]``; export and import keep them whole,
    beside a score store, and an imported entry whose text differs from the held one is a conflict, never served."""
    root, dest = tmp_path / "a", tmp_path / "b"
    gen = {"lm": "m", "dtype": "fp32", "quantity": "generation"}
    ScoreCache(root, gen).put(
        ["p1", "p2", "p3"], ["g", "g", "g"], [["yes", -1.25], ["no", None], ["a", -2.0]], "t"
    )
    ScoreCache(root, {"lm": "m", "dtype": "fp32"}).put(["p1"], ["g"], [-1.3], "t")
    f = tmp_path / "all.json.gz"
    assert sorted(export_scores(root, f).values()) == [1, 3]
    ScoreCache(dest, gen).put(
        ["p1", "p3"], ["g", "g"], [["yes", -1.2501], ["b", -2.0]], "t"
    )  # p3: another text
    got = import_scores(dest, f)[fingerprint(gen)]
    assert got == {"added": 1, "kept": 2, "conflicts": 1}
    assert ScoreCache(dest, gen).get(["p1", "p2", "p3"], ["g"] * 3) == [
        ["yes", -1.2501],
        ["no", None],
        ["b", -2.0],
    ]
    assert ScoreCache(dest, {"lm": "m", "dtype": "fp32"}).get(["p2"], ["g"]) == [None]  # scores stay scores
    with pytest.raises(TypeError):  # a score store takes numbers only
        ScoreCache(root, {"lm": "m", "dtype": "fp32"}).put(["p9"], ["g"], [["text", -1.0]], "t")


def test_staged_exports_carry_each_score_once_and_add_up_to_the_whole(tmp_path, capsys):
    """A long run carried between machines in stages: each stage's export (``--skip`` the earlier ones) holds only
    the scores scored since, per store, and importing every stage gives the store the one full export gives."""
    run_root = tmp_path / "run"
    root = run_root / ".cache" / "scores"
    fp32, bf16 = {"lm": "m", "dtype": "fp32"}, {"lm": "m", "dtype": "bf16"}
    ScoreCache(root, fp32).put(["x", "y"], ["1", "2"], [-1.0, -2.0], "t")
    ScoreCache(root, bf16).put(["x"], ["1"], [-1.5], "t")
    one, two, whole = (tmp_path / f"{n}.json.gz" for n in ("one", "two", "whole"))
    assert sorted(export_scores(root, one).values()) == [1, 2]
    ScoreCache(root, fp32).put(["z"], ["3"], [-3.0], "t")  # the run goes on: one more fp32 score, one bf16
    ScoreCache(root, bf16).put(["y"], ["2"], [-2.5], "t")
    sets = ["--set", f"run_root={run_root}"]
    assert main(["cache", "export", str(two), "--skip", str(one), *sets]) == 0
    assert "exported 1 scores" in capsys.readouterr().out
    assert {len(s["scores"]) for s in read_export(two)} == {1}  # per store, only what came after the first
    export_scores(root, whole)
    staged, full = tmp_path / "staged", tmp_path / "full"
    for f in (one, two):
        import_scores(staged, f)
    import_scores(full, whole)
    for key in (fp32, bf16):
        assert ScoreCache(staged, key).items() == ScoreCache(full, key).items()
    assert len(ScoreCache(staged, fp32)) == 3 and len(ScoreCache(staged, bf16)) == 2
    # nothing new since stage two: a third stage writes no store (its import adds nothing, makes no folder)
    three = tmp_path / "three.json.gz"
    assert sorted(export_scores(root, three, skip=[one, two]).values()) == [0, 0]
    assert read_export(three) == []
    # with `only` (one run's pairs), a pair an earlier stage carries need not be held here
    fresh = tmp_path / "fresh"
    import_scores(fresh, two)
    wanted = {pair_key("x", "1"), pair_key("z", "3")}
    assert export_scores(fresh, tmp_path / "o.json.gz", fp32, wanted, [one]) == {fingerprint(fp32): 1}
    with pytest.raises(FileNotFoundError, match="not scored yet"):
        export_scores(fresh, tmp_path / "o.json.gz", fp32, wanted)  # without the stage that carries x
    # a skipped file that is not an export, or is the file to write, is named, and nothing is written
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"not gzip")
    assert main(["cache", "export", str(tmp_path / "x.json.gz"), "--skip", str(bad), *sets]) == 2
    assert str(bad) in capsys.readouterr().err and not (tmp_path / "x.json.gz").exists()
    before = one.read_bytes()
    assert main(["cache", "export", str(one), "--skip", str(one), *sets]) == 2
    assert "also one to skip" in capsys.readouterr().err and one.read_bytes() == before
    assert main(["cache", "import", str(one), "--skip", str(two), *sets]) == 2
    assert "--skip is for export" in capsys.readouterr().err


def bad_export(key: str, pair: str, score: str) -> bytes:
    """An export file holding one store with this key, pair and score, written as raw JSON text."""
    text = f'{{"format": "epr-score-cache/1", "stores": [{{"key": {key}, "scores": {{"{pair}": {score}}}}}]}}'
    return gzip.compress(text.encode())


@pytest.mark.parametrize(
    "content, match",
    [
        (b"not gzip", "not a score-cache export"),
        (gzip.compress(b'{"format": "other"}'), "expected format"),
        (
            gzip.compress(json.dumps({"format": "epr-score-cache/1", "stores": [{"key": 1}]}).encode()),
            "store #0",
        ),
        (
            gzip.compress(
                json.dumps(
                    {"format": "epr-score-cache/1", "stores": [{"key": {"a": 1}, "scores": {"k": "x"}}]}
                ).encode()
            ),
            "not finite numbers",
        ),
        *[  # a generation store holds [prediction, finite log-prob or null] pairs, nothing else
            (
                bad_export('{"model": "m", "quantity": "generation"}', "a" * 24, v),
                "[prediction, finite log-prob",
            )
            for v in ("-1.5", '["y", "x"]', '["y"]', "[1, -1.5]", '["y", NaN]')
        ],
        *[  # issue 76's crack: NaN and Infinity, an empty or untyped key field, a pair key no pair_key wrote
            (bad_export(key, pair, score), m)
            for key, pair, score, m in [
                ('{"model": "m"}', "a" * 24, "NaN", "not finite"),
                ('{"model": "m"}', "a" * 24, "-Infinity", "not finite"),
                ('{"model": ""}', "a" * 24, "-1.5", "empty or untyped fields"),
                ('{"model": null}', "a" * 24, "-1.5", "empty or untyped fields"),
                ("{}", "a" * 24, "-1.5", "empty or untyped fields"),
                ('{"model": "m"}', "not-a-digest", "-1.5", "not pair_key digests"),
            ]
        ],
    ],
)
def test_a_bad_file_is_named_and_nothing_is_written(tmp_path, content, match, capsys):
    f = tmp_path / "bad.json.gz"
    f.write_bytes(content)
    assert main(["cache", "import", str(f), "--set", f"run_root={tmp_path / 'r'}"]) == 2
    err = capsys.readouterr().err
    assert match in err and str(f) in err
    assert not list((tmp_path / "r").rglob("shard-*"))


class _CountingScorer:
    """A stand-in scorer: log p = -(len(context) + len(target)); pairs over 50 characters are 'too long'; raises
    on the call after ``fail_after`` calls (a killed run)."""

    def __init__(self, fail_after: int | None = None):
        self.calls, self.scored, self.fail_after = 0, 0, fail_after

    def encode(self, contexts, targets):
        return list(zip(contexts, targets))

    def too_long(self, pairs):
        return [i for i, (c, t) in enumerate(pairs) if len(c) + len(t) > 50]

    def score_pairs(self, contexts, targets, pairs):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt("killed")
        self.calls += 1
        self.scored += len(contexts)
        return [-float(len(c) + len(t)) for c, t in zip(contexts, targets)]


def test_cached_scores_fills_the_cache_chunk_by_chunk_and_resumes(tmp_path):
    """A killed scoring pass keeps the chunks it finished: the rerun scores only the rest, and the values are those
    of one unchunked pass (too-long pairs NaN and never cached)."""
    import numpy as np

    from epr.lm.score_cache import cached_scores

    ctx = [f"q{i} " + "x" * (i % 7) for i in range(23)] + ["y" * 60]
    tgt = [f"a{i}" for i in range(24)]
    plain = cached_scores(_CountingScorer(), None, ctx, tgt, "gold", chunk=1000)
    assert np.isnan(plain[-1]) and not np.isnan(plain[:-1]).any()

    cache = ScoreCache(tmp_path, {"lm": "fake"})
    with pytest.raises(KeyboardInterrupt):
        cached_scores(_CountingScorer(fail_after=2), cache, ctx, tgt, "gold", chunk=5)
    assert len(cache) == 10  # two chunks of five kept
    again = _CountingScorer()
    got = cached_scores(again, ScoreCache(tmp_path, {"lm": "fake"}), ctx, tgt, "gold", chunk=5)
    assert again.scored == 13  # the 23 scorable pairs minus the 10 already cached
    np.testing.assert_array_equal(got, plain)


def test_this_run_exports_exactly_the_runs_pairs(tmp_path, tiny_task_files, tiny_lm_dir, capsys):
    """`--this-run`: a results folder ships its own labels, not every other run's scores under the same LM."""
    a = make_ctx(tmp_path / "a", tiny_task_files, tiny_lm_dir)
    pipeline.run(a, until="scores")
    from epr.lm.factory import score_cache

    cache = score_cache(a.cfg)
    cache.put(["another run's context"], ["its target"], [-3.0], "other")  # same LM, not this run's pair
    f = tmp_path / "run.json.gz"
    assert cli(tmp_path / "a", tiny_task_files, tiny_lm_dir, "cache", "export", str(f), "--this-run") == 0
    stores = json.loads(gzip.open(f, "rt").read())["stores"]
    assert len(stores) == 1 and len(stores[0]["scores"]) == 144  # the run's 144 pairs, not the 145 held
    assert set(stores[0]["scores"]) == {k for k in cache.items() if cache.items()[k] != -3.0}
    # a run not fully scored is refused, not exported in part
    b = make_ctx(tmp_path / "b", tiny_task_files, tiny_lm_dir)
    pipeline.run(b, until="candidates")
    score_cache(b.cfg).put(["x"], ["y"], [-1.0], "t")
    assert cli(tmp_path / "b", tiny_task_files, tiny_lm_dir, "cache", "export", str(f), "--this-run") == 2
    assert "pairs are not scored yet" in capsys.readouterr().err


def test_an_import_no_run_of_this_config_reads_says_what_differs(tmp_path, capsys):
    """Scores made on another device (a lent GPU's bf16) go into their own store, which a CPU run never reads: the
    import says so and names the differing fields; a store this config reads gets no note."""
    from epr.config import load_config
    from epr.lm.factory import scoring_key

    run_root = tmp_path / "r"
    cfg = load_config((), [f"run_root={run_root}"])
    mine = scoring_key(cfg)
    gpu = {**mine, "device": "cuda", "dtype": "bf16", "batch_tokens": 65536, "prefix_share": True}
    src = tmp_path / "src"
    ScoreCache(src, gpu).put(["x"], ["1"], [-1.0], "t")
    ScoreCache(src, mine).put(["x"], ["1"], [-1.1], "t")
    f = tmp_path / "both.json.gz"
    export_scores(src, f)
    assert main(["cache", "import", str(f), "--set", f"run_root={run_root}"]) == 0
    out = capsys.readouterr().out
    notes = [x for x in out.splitlines() if x.startswith("note:")]
    assert len(notes) == 1 and ScoreCache(run_root / ".cache" / "scores", gpu).dir.name in notes[0]
    assert "device 'cuda' there, 'cpu' here" in notes[0]
    assert ScoreCache(run_root / ".cache" / "scores", mine).dir.name not in notes[0]

    # a config that accepts the GPU's labels (same dtype there) reads that store: no note for it
    same = {**mine, "device": "cuda", "batch_tokens": 65536, "prefix_share": True}
    src2 = tmp_path / "src2"
    ScoreCache(src2, same).put(["x"], ["1"], [-1.0], "t")
    f2 = tmp_path / "gpu.json.gz"
    export_scores(src2, f2)
    accept = ["--set", f"run_root={run_root}", "--set", "scoring.accept_devices=[cuda]"]
    assert main(["cache", "import", str(f2), *accept]) == 0
    assert "note:" not in capsys.readouterr().out
    assert main(["cache", "import", str(f2), "--set", f"run_root={run_root}"]) == 0
    out = capsys.readouterr().out  # the note says how to read it: only a device or batch layout differs
    assert "note:" in out and "--set 'scoring.accept_devices=[cuda]'" in out
    assert "accept_devices" not in notes[0] or gpu["dtype"] == mine["dtype"]  # another dtype: no such hint


def test_accepted_devices_serve_labels_and_the_rest_is_scored_here(
    tmp_path, tiny_task_files, tiny_lm_dir, monkeypatch
):
    """``scoring.accept_devices``: a CPU run takes the labels a GPU's store holds (same LM, dtype and forward, any
    batch layout), scores only the pairs it lacks into its own store, counts what each store served, and is keyed
    apart from a run that took none; a store of another dtype or LM is never read, nor a device not listed."""
    from epr.cache import read_manifest
    from epr.lm.factory import accepted_stores, scoring_key
    from epr.lm.scoring import LMScorer

    a = make_ctx(tmp_path / "a", tiny_task_files, tiny_lm_dir)
    pipeline.run(a, until="scores")
    plain = ScoreCache(tmp_path / "a" / "runs" / ".cache" / "scores", scoring_key(a.cfg)).items()
    assert len(plain) == 144

    root = tmp_path / "b" / "runs" / ".cache" / "scores"
    mine = scoring_key(a.cfg)  # the same config on the same CPU: b's own store's key
    gpu = {**mine, "device": "cuda", "batch_tokens": 16384, "prefix_share": True}
    held = sorted(plain)[
        10:
    ]  # the GPU scored all but 10 pairs, each 0.5 nats off the CPU's (its own rounding)
    gpu_store = ScoreCache(root, gpu)
    (gpu_store.dir / "shard-t-all.json").write_text(json.dumps({k: plain[k] - 0.5 for k in held}))
    for other in ({**gpu, "dtype": "bf16"}, {**gpu, "lm": "another"}, {**mine, "device": "mps"}):
        c = ScoreCache(root, other)  # never read: another dtype, another LM, a device not listed
        (c.dir / "shard-t-all.json").write_text(json.dumps({k: -99.0 for k in plain}))

    calls = []
    for method in ("score_pairs", "score_prefixed"):
        real = getattr(LMScorer, method)

        def counted(self, *args, _real=real, **kw):
            calls.append(len(args[-1] if "pairs" not in kw else kw["pairs"]))
            return _real(self, *args, **kw)

        monkeypatch.setattr(LMScorer, method, counted)
    b = make_ctx(tmp_path / "b", tiny_task_files, tiny_lm_dir, "scoring.accept_devices=[cuda]")
    assert [d.name for d in accepted_stores(b.cfg)] == [gpu_store.dir.name]
    pipeline.run(b, until="scores")
    assert sum(calls) == 10  # only the pairs the GPU's store lacks
    own = ScoreCache(root, mine).items()
    assert own == {k: plain[k] for k in sorted(plain)[:10]}  # scored here, into this device's store only
    from epr.stages.scores import scored_pairs

    got = {}
    rows = [json.loads(x) for x in (b.stage_dir("scores") / "scores.jsonl").read_text().splitlines()]
    by_q = {r.qid: r for r in b.rankings("candidates", "candidates.jsonl")}
    pool = b.examples("pool")
    for row in rows:
        _, ctxs, tgts, _ = scored_pairs(b.task, pool, [by_q[row["qid"]]])
        got.update({pair_key(c, t): s for c, t, s in zip(ctxs, tgts, row["scores"])})
    assert got == {k: (plain[k] - 0.5 if k in set(held) else plain[k]) for k in plain}
    first = (b.stage_dir("scores") / "scores.jsonl").read_bytes()
    sources = {gpu_store.dir.name: 134, ScoreCache(root, mine).dir.name: 10, "missing": 0}
    assert read_manifest(b.stage_dir("scores"))["label_sources"] == sources
    speed = read_manifest(b.stage_dir("scores"))["scoring_speed"]  # the model's loading is a part of its own
    assert speed["scored_here"] == 10 and speed["seconds_by_part"]["load"] >= 0  # (a tiny LM: ~0 s)
    # `--this-run` ships the run's labels from every store they came from, each score under its own key
    f = tmp_path / "run.json.gz"
    args = ("cache", "export", str(f), "--this-run", "--set", "scoring.accept_devices=[cuda]")
    assert cli(tmp_path / "b", tiny_task_files, tiny_lm_dir, *args) == 0
    shipped = {fingerprint(x["key"]): x["scores"] for x in read_export(f)}
    assert shipped == {
        ScoreCache(root, mine).dir.name: own,
        gpu_store.dir.name: {k: plain[k] - 0.5 for k in held},
    }

    # keyed apart: the same config without accepting is another stage, which reads this device's store only
    calls.clear()
    c = make_ctx(tmp_path / "b", tiny_task_files, tiny_lm_dir)
    assert read_manifest(b.stage_dir("scores"))["fingerprint"] != pipeline.stage_fingerprint(c, "scores")
    pipeline.run(c, until="scores")
    assert sum(calls) == 134 and ScoreCache(root, mine).items() == plain
    # accepting again, with this device's store now holding every pair: the GPU's labels still come first
    calls.clear()
    b = make_ctx(tmp_path / "b", tiny_task_files, tiny_lm_dir, "scoring.accept_devices=[cuda]")
    pipeline.run(b, until="scores")
    assert sum(calls) == 0 and read_manifest(b.stage_dir("scores"))["label_sources"] == sources
    assert (b.stage_dir("scores") / "scores.jsonl").read_bytes() == first

    # asked to accept with no such store (the import not done): an error naming what differs, nothing scored
    d = make_ctx(tmp_path / "d", tiny_task_files, tiny_lm_dir, "scoring.accept_devices=[cuda]")
    ScoreCache(tmp_path / "d" / "runs" / ".cache" / "scores", {**gpu, "dtype": "bf16"})
    with pytest.raises(
        InputError, match=r"scoring.accept_devices=\['cuda'\]: no score store .* dtype 'bf16'"
    ):
        pipeline.run(d, until="scores")
    assert calls == []
