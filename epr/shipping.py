"""A retriever you can ship: ``PromptRetriever.save_pretrained(dir)`` / ``PromptRetriever.from_pretrained(dir)``.

The folder holds everything retrieval needs and nothing of the run that made it, so it loads with no run folder,
no config and no model package:

    retriever.json      what the folder holds (format, task, prompt rules, RAGSys settings, the served mode with
                        its BM25 backend and the run's selection summary, where it came from)
    encoder/            both towers (or the one shared tower) and their tokenizer (``DualEncoder.save_pretrained``)
    pool.jsonl          the demonstrations, in index order
    index.faiss         their prompt-tower embeddings
    tokenizer/          the inference LM's tokenizer, which counts the prompt budget
    quality_bias.npy    the pool's RAGSys quality bias under the run's inference LM (when the run computed it)
    reward/             the trained reward model (``epr.reward``) a ``+rm`` mode re-ranks with (only for one)
    README.md           a model card: data, LM, loss, training and dev metrics, the run's comparison table
    manifest.json       every other file's size and sha256: ``from_pretrained`` names a missing or corrupt one

``epr export OUT_DIR`` writes one from a run. It never deletes what it was not asked to: a non-empty ``OUT_DIR`` is
refused unless ``--overwrite``, and even then a folder above the run, the current and the home folder are; the run
folder, the run root and anything inside them are refused always.
The folder is written beside ``OUT_DIR`` under a temporary name and renamed into place at the end (the old folder is
moved aside first and removed only once the new one is in place), so a killed export leaves the previous one intact.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from epr.artifacts import apply_umask, atomic_write_text, dir_mode, read_jsonl, sha256_file, write_jsonl
from epr.cache import read_manifest
from epr.config.names import is_reranked
from epr.model_card import model_card, restate_served, run_card
from epr.types import Example, InputError

PromptRetriever = (
    Any  # an ``epr.api.PromptRetriever`` (the API builds it from ``Shipped``; this module never imports it)
)

__all__ = ["FORMAT", "FORMAT_MODES", "MANIFEST", "Shipped", "save", "load", "check_destination", "verify"]

FORMAT = "epr-retriever/1"
# a folder serving hybrid or BM25: an epr that predates modes refuses it rather than serve the dense ranking
FORMAT_MODES = "epr-retriever/2"
READS = (FORMAT, FORMAT_MODES)
MANIFEST = "manifest.json"
REQUIRED = ("retriever.json", "pool.jsonl", "index.faiss", "encoder", "tokenizer")
log = logging.getLogger(__name__)


def check_destination(out: str | Path, overwrite: bool = False, protect=(), roots=()) -> None:
    """Refuse a destination whose writing would delete or mix into something not asked for. Always, with or
    without ``overwrite``: a folder in ``protect`` (the run it exports from) or anything inside it (its
    ``encoder/``, ``labels/``, ...), a folder in ``roots`` (the run root) or anything inside it (every run lives
    there), an existing file. A non-empty folder unless ``overwrite``; and even with ``overwrite`` a folder above
    the run, the current folder, the home folder or the filesystem root, and their parents. A refusal suggests
    ``--overwrite`` only where it would be accepted."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(
            f"{out}: an existing file, not a folder; a retriever is a folder: name a new folder "
            "(nothing was written or removed)"
        )
    if not out.exists() and out.is_symlink():
        raise InputError(f"{out}: a broken symbolic link; name a new folder (nothing was written or removed)")
    real = out.resolve()
    runs = [(Path(p).resolve(), "the run folder it exports from") for p in protect]
    runs += [
        (Path(r).resolve(), "the run root, where the run folder and every other run live") for r in roots
    ]
    for g, what in runs:
        if real == g or g in real.parents:
            where = f"is {what}" if real == g else f"is inside {what} ({g})"
            raise InputError(
                f"{out}: {where}; export never writes into a run or the run root, with or without --overwrite "
                "(it would replace or mix into the run's own files): name a folder outside them "
                "(nothing was written or removed)"
            )
    if not out.exists():
        return
    entries = sorted(p.name for p in out.iterdir())
    if not entries:
        return
    guarded = [(Path(p).resolve(), "the run folder it exports from") for p in protect]
    guarded += [(Path.cwd().resolve(), "the current folder"), (Path.home().resolve(), "your home folder")]
    for g, what in guarded:
        if real == g or real in g.parents:
            rel = "" if real == g else f" (a folder above {g})"
            raise InputError(
                f"{out}: is {what}{rel}; export replaces only a folder of its own, even with --overwrite: "
                "name a new or empty folder (nothing was written or removed)"
            )
    if not overwrite:
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise InputError(
            f"{out}: not empty ({len(entries)} entries: {shown}); export never deletes: name a new or empty folder, "
            "or pass --overwrite (save_pretrained(..., overwrite=True)) to replace this one"
        )


def _tidy(out: Path) -> None:
    """What a killed export left beside ``out``: a half-written folder (removed), or the previous export moved
    aside before the new one was renamed into place (put back when ``out`` is missing, else removed)."""
    for p in sorted(out.parent.glob(f".{out.name}.partial-*")):
        log.info("%s: removing a half-written export left by a killed run", p)
        shutil.rmtree(p, ignore_errors=True)
    for p in sorted(out.parent.glob(f".{out.name}.old-*")):
        if not out.exists():
            log.warning("%s: a previous export moved aside by a killed run: put back as %s", p, out)
            os.rename(p, out)
        else:
            shutil.rmtree(p, ignore_errors=True)


def _file_list(root: Path) -> dict[str, dict]:
    return {
        p.relative_to(root).as_posix(): {"size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.relative_to(root).as_posix() != MANIFEST
    }


def verify(path: Path) -> None:
    """Every file a shipped folder needs is there and, where it has a manifest, whole (size and sha256): an error
    names the file instead of a faiss, JSON or hub error further down."""
    m = path / MANIFEST
    fix = "export it again (epr export) or download it again"
    if not m.exists():  # written before manifests: at least the parts must be there
        for name in REQUIRED:
            if not (path / name).exists():
                raise InputError(f"{path / name}: missing from the shipped retriever {path}; {fix}")
        return
    try:
        files = json.loads(m.read_text(encoding="utf-8"))["files"]
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"{m}: unreadable manifest ({e}); {fix}") from None
    for name, want in files.items():
        f = path / name
        if not f.is_file():
            raise InputError(
                f"{f}: missing from the shipped retriever {path} (its {MANIFEST} lists it); {fix}"
            )
        size = f.stat().st_size
        if size != want["size"]:
            raise InputError(f"{f}: corrupt: {size} bytes, {MANIFEST} says {want['size']}; {fix}")
        if sha256_file(f) != want["sha256"]:
            raise InputError(f"{f}: corrupt: its sha256 differs from the one in {MANIFEST}; {fix}")


def save(
    r: PromptRetriever,
    out: str | Path,
    card: str | None = None,
    run: str | Path | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``r`` into the folder ``out``, refused as :func:`check_destination` says (``overwrite``: replace a
    non-empty folder). Written under a temporary name beside ``out`` and renamed into place, so a half-written
    folder is never left under the name and a killed write leaves the previous folder intact. ``run``: the run
    folder it came from, for the model card (its training and comparison) and provenance."""
    out = Path(out)
    check_destination(out, overwrite, protect=[run] if run is not None else [])
    out.parent.mkdir(parents=True, exist_ok=True)
    _tidy(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    os.chmod(tmp, dir_mode())  # mkdtemp's 0700 would hide a shared retriever from its other users
    try:
        _write(r, tmp, card, run)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{secrets.token_hex(4)}")
        os.rename(out, old)
    os.rename(tmp, out)
    if old is not None:
        shutil.rmtree(old)
    return out


def _write(r: PromptRetriever, tmp: Path, card: str | None, run: str | Path | None) -> None:
    """Every file of the folder into ``tmp``, ``manifest.json`` last."""
    from transformers import AutoTokenizer

    from epr.lm.models import resolve_lm
    from epr.retrieval.index import save_index

    r.encoder.save_pretrained(tmp / "encoder")
    write_jsonl(tmp / "pool.jsonl", [e.to_json() for e in r.pool])
    save_index(r.index, tmp / "index.faiss")
    tok_dir = Path(r.budget.tokenizer)
    tok = AutoTokenizer.from_pretrained(str(tok_dir) if tok_dir.is_dir() else resolve_lm(r.budget.tokenizer))
    tok.save_pretrained(tmp / "tokenizer")
    if r.quality is not None:
        np.save(tmp / "quality_bias.npy", np.asarray(r.quality, dtype=np.float32))
    reward = r.reward if is_reranked(r.mode) else None  # a plain mode's folder stays without it
    if reward is not None:
        reward.save(tmp / "reward")
    b = r.budget
    fmt = FORMAT if r.mode == "epr" else FORMAT_MODES
    meta = {
        "format": fmt,
        "task": _task_config(r.task),
        "budget": {"prompt_budget": b.prompt_budget, "answer_reserve": b.answer_reserve, "max_demos": b.max_demos,
                   "k": b.k, "tokenizer_name": b.tokenizer},
        "ragsys": dict(r.ragsys),
        "prompt": r.format.spec(),  # the run's prompt format: the folder renders what the labels scored
        "pool_size": len(r.pool),
        "quality_bias": r.quality is not None,
        "mode": r.mode,
        "bm25_backend": r.bm25_backend,
        "reward": None if reward is None else {"top_k": reward.top_k},
        "selection": _selection_summary(r.selection_report),
        "source": _source(Path(run)) if run is not None else getattr(r, "shipped", {}).get("source", {}),
    }  # fmt: skip
    atomic_write_text(tmp / "retriever.json", json.dumps(meta, indent=2) + "\n")
    if card is None and run is not None:
        card = run_card(Path(run), meta)
    if card is None:  # a retriever loaded from a shipped folder keeps its card, restating what it serves
        kept = getattr(r, "shipped", {}).get("card")
        card = restate_served(kept, meta) if kept else model_card(meta, {})
    atomic_write_text(tmp / "README.md", card)
    apply_umask(tmp)  # the encoder's and tokenizer's files as the umask says (transformers writes some 0600)
    manifest = {"format": fmt, "files": _file_list(tmp)}
    atomic_write_text(tmp / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _selection_summary(report: dict | None) -> dict | None:
    """What the card and a reader need of the run's select report: what was chosen, why, on how many held-out
    queries, and the compared rows."""
    keys = ("selected", "reason", "baseline", "n", "rule", "rows")
    return None if report is None else {k: report[k] for k in keys if k in report}


def _source(run: Path) -> dict:
    fps = {st: (read_manifest(run / st) or {}).get("fingerprint") for st in ("examples", "labels", "encoder")}
    return {"run": str(run), "fingerprints": fps}


def _task_config(task) -> dict:
    import dataclasses

    return dataclasses.asdict(task.cfg)


def looks_like_hub_id(name: str) -> bool:
    """``owner/name`` that is not a local path (sentence-transformers' convention for hub ids)."""
    parts = str(name).split("/")
    return len(parts) == 2 and all(parts) and not Path(name).exists() and not str(name).startswith((".", "~"))


def resolve(path: str | Path, revision: str | None = None, token: str | None = None) -> Path:
    """A local folder as it is; a hub id (``owner/name``) downloaded to the hub cache (or found there offline)."""
    if Path(path).is_dir() or not looks_like_hub_id(str(path)):
        return Path(path)
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(str(path), revision=revision, token=token))
    except Exception as e:  # offline, unknown repo, no access: say which and what to do
        raise FileNotFoundError(
            f"{path}: no such folder, and the hub did not give it ({type(e).__name__}: {e}). Pass a local folder "
            "written by `epr export`, or check the repo id, your network and HF_TOKEN"
        ) from e


def push_to_hub(
    r: PromptRetriever,
    repo_id: str,
    private: bool = False,
    token: str | None = None,
    commit_message: str = "Add EPR retriever",
    run: str | Path | None = None,
) -> str:
    """Write ``r`` as :func:`save` does and upload the folder to the hub repo ``repo_id`` (created if missing);
    returns the commit URL. ``from_pretrained(repo_id)`` loads it back."""
    import tempfile

    from huggingface_hub import HfApi

    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    with tempfile.TemporaryDirectory() as tmp:
        out = save(r, Path(tmp) / "retriever", run=run)
        info = api.upload_folder(
            repo_id=repo_id, folder_path=str(out), commit_message=commit_message, repo_type="model"
        )
    return str(getattr(info, "commit_url", info))


@dataclass
class Shipped:
    """The parts of a shipped retriever, as :func:`load` reads them; ``PromptRetriever.from_pretrained`` builds the
    retriever from them. ``budget``: the saved prompt rules (``prompt_budget``, ``answer_reserve``, ``max_demos``,
    ``k``) with ``tokenizer`` pointing at the folder's copy."""

    encoder: Any
    pool: list
    task: Any
    index: Any
    budget: dict
    count: Callable[[str], int]
    ragsys: dict
    quality: np.ndarray | None
    card: str
    source: dict
    mode: str = "epr"  # a folder written before modes serves the dense ranking, as it did
    bm25_backend: str = "bm25s"
    selection: dict | None = None
    prompt: dict | None = (
        None  # the prompt format (``PromptFormat.spec``); a folder written before it: the task's
    )
    tokenizer: Any = None
    reward: Any = None  # an epr.reward.serve.Reranker over the folder's reward/, where it has one


def load(path: str | Path, revision: str | None = None, token: str | None = None) -> Shipped:
    from transformers import AutoTokenizer

    from epr.config import DataConfig, config_from_dict
    from epr.encoder.model import DualEncoder
    from epr.lm.models import quiet_length_warning
    from epr.retrieval.index import load_index
    from epr.retrieval.modes import BM25_BACKENDS, MODES
    from epr.reward.serve import Reranker
    from epr.tasks import get_task

    path = resolve(path, revision, token)
    f = path / "retriever.json"
    if not path.is_dir():
        raise InputError(f"{path}: not a folder; pass a folder written by `epr export` (or a hub repo id)")
    if not f.exists() and not (path / MANIFEST).exists():
        raise InputError(f"{path}: not a shipped retriever (no retriever.json; write one with `epr export`)")
    verify(path)
    try:
        meta = json.loads(f.read_text(encoding="utf-8"))
    except ValueError as e:
        raise InputError(f"{f}: not valid JSON ({e}); export the retriever again (epr export)") from None
    if meta.get("format") not in READS:
        raise InputError(
            f"{f}: format {meta.get('format')!r}; this epr reads {' or '.join(map(repr, READS))}"
        )
    mode, backend = meta.get("mode", "epr"), meta.get("bm25_backend", "bm25s")
    if mode not in MODES or backend not in BM25_BACKENDS:
        raise InputError(f"{f}: mode {mode!r} with BM25 backend {backend!r}; this epr serves modes "
                         f"{', '.join(MODES)} with {' or '.join(BM25_BACKENDS)}")  # fmt: skip
    if is_reranked(mode) and not (meta.get("reward") and (path / "reward").is_dir()):
        raise InputError(
            f"{f}: serves {mode!r} but the folder holds no reward model (reward/); export it again"
        )
    task = get_task(config_from_dict(DataConfig, meta["task"], where=str(f)))
    pool = [Example.from_json(x) for x in read_jsonl(path / "pool.jsonl")]
    index = load_index(path / "index.faiss")
    if index.ntotal != len(pool):
        raise InputError(f"{path}: index.faiss holds {index.ntotal} vectors for {len(pool)} pool rows")
    b = meta["budget"]
    tok = quiet_length_warning(AutoTokenizer.from_pretrained(str(path / "tokenizer")))  # the API warns itself
    prompt = meta.get("prompt")
    want = (prompt or {}).get("chat_template_sha256")
    if want and hashlib.sha256((tok.chat_template or "").encode()).hexdigest() != want:
        raise InputError(f"{path / 'tokenizer'}: its chat template is not the one the retriever's prompts were "
                         "rendered with (retriever.json's prompt.chat_template_sha256); export the retriever again")  # fmt: skip
    budget = {k: b[k] for k in ("prompt_budget", "answer_reserve", "max_demos", "k")} | {
        "tokenizer": str(path / "tokenizer")
    }
    return Shipped(
        encoder=DualEncoder.from_pretrained(str(path / "encoder")),
        pool=pool,
        task=task,
        index=index,
        budget=budget,
        count=lambda s: len(tok(s, add_special_tokens=False)["input_ids"]),
        ragsys=meta["ragsys"],
        quality=np.load(path / "quality_bias.npy") if meta.get("quality_bias") else None,
        card=(path / "README.md").read_text(encoding="utf-8"),
        source=meta.get("source", {}),
        mode=mode,
        bm25_backend=backend,
        selection=meta.get("selection"),
        prompt=prompt,
        tokenizer=tok,
        reward=Reranker(path / "reward", meta["reward"]["top_k"]) if meta.get("reward") else None,
    )
