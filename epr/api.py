"""Use a trained retriever from Python.

from epr.api import PromptRetriever
r = PromptRetriever.from_run("runs/mydata")
res = r.retrieve("turn on the kitchen lights", k=4)
print(res.prompt)          # the demonstrations that fit the run's prompt budget (best last) + the query
for ex, score in zip(res.demos, res.scores): print(score, ex.input, "->", ex.output)

The prompt is built exactly as the run's ``prompts`` stage builds it (``epr.stages.prompts.prompt_maker``'s
budget rules, counted in the inference LM's tokens): the API's ready prompt is the prompt that was evaluated.

It ranks the pool by its ``mode`` (:mod:`epr.retrieval.modes`): ``epr`` (the trained dense encoder), ``hybrid``
(that ranking fused with BM25 over the pool's inputs by reciprocal rank) or ``bm25``, each also re-ranked by the
run's trained reward model (``epr+rm``, ``hybrid+rm``, ``bm25+rm``). ``from_run`` serves what the
run's ``select`` stage chose (``<run>/select/report.json``), ``epr`` where the run has no finished select stage.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from epr.artifacts import read_jsonl
from epr.cache import fingerprint, read_manifest
from epr.config import DataConfig, RagsysConfig, RetrieveConfig, config_from_dict
from epr.encoder.model import DualEncoder
from epr.prompt import PromptFormat, config_from_spec
from epr.retrieval.index import build_index, load_index, save_index, search
from epr.retrieval.modes import (
    LazyBM25,
    check_mode,
    rank,
    run_prompt,
    run_reranker,
    served_mode,
    warn_changed_data,
)
from epr.retrieval.prompt_budget import Budget, build_prompt
from epr.tasks import get_task
from epr.types import Example, UpstreamError

__all__ = ["PromptRetriever", "RetrievalResult", "Selection"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetrievalResult:
    demos: list[Example]  # best first
    scores: list[float]  # best first: inner products (epr), BM25 scores (bm25), fused RRF scores (hybrid)
    prompt: str  # [e_j; ...; e_1; query]: the demonstrations that fit the budget, best right before the query
    prompt_demos: int = 0  # how many of ``demos`` (the best ones) the prompt holds
    messages: list[dict] | None = (
        None  # chat mode: the prompt as role / content pairs (what ``prompt`` renders)
    )


@dataclass(frozen=True)
class Selection:
    """How the LangChain and dspy adapters pick demonstrations (:meth:`PromptRetriever.select`): ``k`` of them, the
    served mode's top-k when ``lambda_d`` = ``lambda_b`` = 1, else RAGSys over its ``shortlist`` best."""

    k: int = 4
    lambda_d: float = 1.0
    lambda_b: float = 1.0
    shortlist: int = 50

    @classmethod
    def split(cls, kwargs: dict, selection: Selection | None = None) -> tuple[Selection, dict]:
        """(the selection settings among ``kwargs``, or ``selection``; the other keywords). Both at once is an
        error."""
        names = {f.name for f in dataclasses.fields(cls)}
        mine = {k: v for k, v in kwargs.items() if k in names}
        if mine and selection is not None:
            raise TypeError(f"pass selection= or {', '.join(mine)}, not both")
        return selection or cls(**mine), {k: v for k, v in kwargs.items() if k not in names}

    def check(self, retriever: PromptRetriever) -> None:
        if self.lambda_b != 1.0 and retriever.quality is None:
            raise ValueError(
                "lambda_b < 1 needs the pool's quality bias (RAGSys: the inference LM's perplexity of each "
                "demonstration), and this retriever has none: the run computes it when a retriever ending in "
                "+bias is among retrieve.retrievers (e.g. --set 'retrieve.retrievers=[epr,hybrid,epr+div+bias]'), "
                "in its rerank stage; export again after that run"
            )

    def ids(self, retriever: PromptRetriever, query: str) -> list[int]:
        """Pool ids, best first."""
        return retriever.select(str(query), self.k, self.lambda_d, self.lambda_b, self.shortlist)


def _check_query(query, k) -> tuple[str, int]:
    """``query`` a non-empty ``str``, ``k`` an ``int`` >= 1: else a TypeError / ValueError saying what was given."""
    if not isinstance(query, str):
        raise TypeError(f"query must be a str, got {type(query).__name__} ({query!r:.60})")
    if not query.strip():
        raise ValueError("query is empty (or only whitespace); pass the text to find demonstrations for")
    try:
        query.encode("utf-8")
    except UnicodeEncodeError as e:  # a tokenizer would fail on it with a TypeError that names nothing
        raise ValueError(
            f"query holds {query[e.start]!r} at character {e.start + 1}, a lone surrogate (an escape such as \\ud800 "
            "without its pair); it is not text a tokenizer can read: fix the string"
        ) from None
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"k must be an int >= 1, got {type(k).__name__} ({k!r:.60})")
    if k < 1:
        raise ValueError(f"k={k}: must be >= 1 (how many demonstrations to retrieve)")
    return query, int(k)


class PromptRetriever:
    """A trained EPR encoder over a run's demonstration pool, with a cached faiss index, serving the ranking its
    ``mode`` names (:mod:`epr.retrieval.modes`): ``epr`` (the dense index), ``hybrid`` or ``bm25``.
    ``selection_report``: the run's ``select`` stage summary (what was chosen, why, the compared rows), shipped
    with the retriever and stated in its model card."""

    def __init__(
        self,
        encoder: DualEncoder,
        pool: list[Example],
        task,
        index=None,
        factory: str = "Flat",
        budget: Budget | None = None,
        count: Callable[[str], int] | None = None,
        ragsys: dict | None = None,
        quality: np.ndarray | None = None,
        mode: str = "epr",
        bm25_backend: str = "bm25s",
        selection_report: dict | None = None,
        prompt: dict | None = None,
        tokenizer=None,
        reward=None,
    ):
        self.reward = reward  # an epr.reward.serve.Reranker (the +rm modes re-rank with it), or None
        check_mode(mode, bm25_backend, reward is not None)
        self.prompt_config, self._tok, self._format = config_from_spec(prompt), tokenizer, None
        self.encoder, self.pool, self.task = encoder, pool, task
        self._mode, self._bm25 = mode, LazyBM25(bm25_backend)
        self.selection_report = selection_report
        self.ragsys = dict(ragsys) if ragsys is not None else dataclasses.asdict(RagsysConfig())
        self.quality = (
            quality  # the pool's RAGSys quality bias under the run's inference LM, where it has one
        )
        if index is None:
            index = build_index(
                encoder.encode([encoder.demo(task, e) for e in pool], "prompt", progress=True), factory
            )
        self.index = index
        d = RetrieveConfig()
        self.budget = budget or Budget(d.prompt_budget, d.answer_reserve, d.max_demos, "smollm2")
        self._count = count

    @property
    def mode(self) -> str:
        """The served ranking: ``epr``, ``hybrid`` or ``bm25``, or one of them ``+rm`` (settable)."""
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        check_mode(mode, self.bm25_backend, self.reward is not None)
        self._mode = mode

    bm25_backend = property(lambda self: self._bm25.backend, doc="``bm25s`` or ``rank_bm25``")

    @classmethod
    def from_run(cls, run_dir: str | Path, factory: str = "Flat", mode: str | None = None) -> PromptRetriever:
        """The run's trained encoder and pool; the prompt rules of its ``prompts`` stage (defaults where the run
        has not built prompts); ``mode`` where given, else what its finished ``select`` stage chose, else ``epr``
        (the log says which and why). The faiss index is cached under ``<run_dir>/.cache/index/``, keyed by the
        encoder's and the pool's fingerprints and the index factory."""
        run = Path(run_dir)
        if not run.is_dir():
            raise UpstreamError(
                f"{run}: no such run folder (a run's folder is <run_root>/<name>, e.g. runs/mydata); if nothing has "
                "run under this name yet, `epr run --until encoder` with the same -c/--set trains it"
            )
        if (run / "retriever.json").exists():
            raise UpstreamError(f"{run}: an exported retriever, not a run folder: load it with "
                                f"PromptRetriever.from_pretrained({str(run)!r})")  # fmt: skip
        model = run / "encoder" / "model"
        enc_man, ex_man = read_manifest(run / "encoder"), read_manifest(run / "examples")
        if not model.exists() or enc_man is None or ex_man is None:
            raise UpstreamError(
                f"{run}: no trained encoder in this run ({model} is missing or unfinished); train it first: "
                "`epr run --until encoder` with the same -c/--set (see README)"
            )
        task = get_task(config_from_dict(DataConfig, ex_man["config"]["data"]))
        warn_changed_data(run, ex_man)
        pool = [Example.from_json(r) for r in read_jsonl(run / "examples" / "pool.jsonl")]
        mode, backend, report = served_mode(run, mode, enc_man["fingerprint"])
        enc = DualEncoder.from_pretrained(str(model))
        pm, rm = read_manifest(run / "prompts"), read_manifest(run / "retrieve")
        budget = None
        if pm is not None:
            c = pm["config"]
            k = rm["config"]["k"] if rm is not None else RetrieveConfig().k
            budget = Budget(c["prompt_budget"], c["answer_reserve"], c["max_demos"], c["tokenizer"]["lm"], k)
        rr = read_manifest(run / "rerank")
        ragsys = rr["config"].get("ragsys") if rr is not None else None
        qf = run / "rerank" / "quality_bias.npy"
        extra = {"budget": budget, "ragsys": ragsys, "quality": np.load(qf) if qf.exists() and rr else None,
                 "mode": mode, "bm25_backend": backend, "selection_report": report, "prompt": run_prompt(run),
                 "reward": run_reranker(run)}  # fmt: skip
        key = {"encoder": enc_man["fingerprint"], "pool": ex_man["fingerprint"], "factory": factory}
        cached = run / ".cache" / "index" / f"{fingerprint(key)}.faiss"
        if cached.exists():
            return cls(enc, pool, task, load_index(cached), **extra)
        r = cls(enc, pool, task, factory=factory, **extra)
        save_index(r.index, cached)
        return r

    def save_pretrained(
        self,
        out: str | Path,
        card: str | None = None,
        run: str | Path | None = None,
        overwrite: bool = False,
    ) -> Path:
        """A self-contained folder (encoder, pool, faiss index, prompt rules, tokenizer, RAGSys settings and
        quality bias, the served mode and why it was chosen, model card, a manifest of file digests) that
        :meth:`from_pretrained` loads with no run folder or config. A non-empty ``out`` is refused unless
        ``overwrite`` (and the run folder, the current and the home folder always are)."""
        from epr import shipping

        return shipping.save(self, out, card, run, overwrite)

    @classmethod
    def from_pretrained(
        cls, path: str | Path, revision: str | None = None, token: str | None = None
    ) -> PromptRetriever:
        """Load a folder written by :meth:`save_pretrained` / ``epr export``, or a hub repo id (``owner/name``,
        as sentence-transformers loads them; ``revision`` and ``token`` go to the hub). It serves the mode it was
        saved with (``epr`` for a folder written before modes)."""
        from epr import shipping

        parts = shipping.load(path, revision, token)
        r = cls(
            parts.encoder, parts.pool, parts.task, parts.index, budget=Budget(**parts.budget), count=parts.count,
            ragsys=parts.ragsys, quality=parts.quality, mode=parts.mode, bm25_backend=parts.bm25_backend,
            selection_report=parts.selection, prompt=parts.prompt, tokenizer=parts.tokenizer, reward=parts.reward,
        )  # fmt: skip
        # saved again (save_pretrained, push_to_hub), it keeps its model card and provenance
        r.shipped = {"card": parts.card, "source": parts.source}
        log.info("%s: serving the %r retriever", path, r.mode)
        return r

    def push_to_hub(
        self,
        repo_id: str,
        private: bool = False,
        token: str | None = None,
        commit_message: str = "Add EPR retriever",
    ) -> str:
        """Upload the retriever (the :meth:`save_pretrained` folder) to the hub repo ``repo_id``; returns the commit
        URL. ``PromptRetriever.from_pretrained(repo_id)`` loads it back."""
        from epr import shipping

        return shipping.push_to_hub(self, repo_id, private, token, commit_message)

    @property
    def tokenizer(self):
        """The inference LM's tokenizer: it counts the prompt budget and, in chat mode, renders the prompt."""
        if self._tok is None:
            from transformers import AutoTokenizer

            from epr.lm.models import quiet_length_warning, resolve_lm

            self._tok = quiet_length_warning(AutoTokenizer.from_pretrained(resolve_lm(self.budget.tokenizer)))
        return self._tok

    @property
    def format(self) -> PromptFormat:
        """The run's prompt format (its ``prompt`` section): the prompt is rendered as the run's labels and
        evaluation rendered it."""
        if self._format is None:
            self._format = PromptFormat(
                self.task, self.prompt_config, self.tokenizer if self.prompt_config.chat else None
            )
        return self._format

    def count(self, text: str) -> int:
        if self._count is None:
            tok = self.tokenizer
            self._count = lambda s: len(tok(s, add_special_tokens=False)["input_ids"])
        return self._count(text)

    def _rank(self, query: str, k: int, q: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The served mode's ``k`` best pool ids and scores (:func:`epr.retrieval.modes.rank`); ``q``: the query's
        embedding ``(1, H)`` where the caller has it (encoded here only if the mode needs it)."""

        def dense(n: int) -> tuple[np.ndarray, np.ndarray]:
            ids, sc = search(self.index, self.encoder.encode([query], "query") if q is None else q, n)
            keep = ids[0] >= 0
            return ids[0][keep], sc[0][keep]

        rr = self.reward and (lambda query, ids: self.reward(query, ids, self.pool, self.task))
        return rank(self.mode, query, k, dense, lambda: self._bm25(self.pool), rr, self.budget.k)

    def retrieve(self, query: str, k: int | None = None) -> RetrievalResult:
        """The ``k`` best demonstrations by the served mode (default ``k``: the run's ``retrieve.k``, as the
        prompts stage saw them), their scores (inner products for ``epr``, BM25 scores for ``bm25``, fused
        reciprocal-rank scores for ``hybrid``) and the prompt of those that fit the budget."""
        query, k = _check_query(query, self.budget.k if k is None else k)
        ids, sc = self._rank(query, k)
        demos = [self.pool[i] for i in ids]
        b = self.budget
        fmt, x = self.format, Example(-1, query, "", {})
        p = build_prompt(
            fmt,
            x,
            [int(i) for i in ids],
            self.pool,
            self.count,
            b.prompt_budget,
            b.answer_reserve,
            b.max_demos,
        )
        if demos and not p.demo_ids:
            log.warning(
                "retrieve: the query alone (%d characters) leaves no room in the prompt budget (%d tokens of %s): "
                "the prompt holds no demonstrations",
                len(query),
                b.prompt_budget,
                b.tokenizer,
            )
        msgs = fmt.messages([self.pool[i] for i in reversed(p.demo_ids)], x) if fmt.chat else None
        return RetrievalResult(demos, [float(s) for s in sc], p.text, len(p.demo_ids), msgs)

    def select(
        self,
        query: str,
        k: int = 4,
        lambda_d: float = 1.0,
        lambda_b: float = 1.0,
        shortlist: int = 50,
    ) -> list[int]:
        """Pool ids of ``k`` demonstrations for ``query``, best first: the served mode's top-k when ``lambda_d`` =
        ``lambda_b`` = 1; otherwise the mode's ``shortlist`` best re-ranked by RAGSys (Algorithm 1, SPEC 3.1:
        ``lambda_d`` relevance vs diversity, ``lambda_b`` relevance vs the pool's quality bias), relevance and
        diversity measured with the trained encoder's embeddings whatever the mode. The LangChain and dspy
        adapters select through this."""
        from ragsys import mmr_select

        query, k = _check_query(query, k)
        Selection(k, lambda_d, lambda_b, shortlist).check(self)
        if lambda_d == 1.0 and lambda_b == 1.0:
            return self._rank(query, k)[0].tolist()
        q = self.encoder.encode([query], "query")
        cand = self._rank(query, max(shortlist, k), q)[0]
        emb = np.stack([self.index.reconstruct(int(i)) for i in cand])
        quality = None if self.quality is None else np.asarray(self.quality)[cand]
        pick = mmr_select(q[0], emb, quality, min(k, len(cand)), lambda_d, lambda_b)
        return cand[pick].tolist()

    def add(self, input: str, output: str) -> int:
        """Encode a new demonstration with the demonstration tower and add it to the pool and the index (no
        retraining; BM25 over the inputs is rebuilt on its next use); returns its pool id. Its quality bias, where the pool has them, is the pool's mean (scoring
        it would need the LM). The texts follow a data file's rules (:func:`epr.tasks.base.field_text`: a number is
        written as JSON writes it; an object, an array or None is a ``TypeError``); an empty one, or an output
        holding the task's end marker, is a ``ValueError``; nothing is added then."""
        from epr.tasks.base import field_text

        texts = {}
        for name, v in (("input", input), ("output", output)):
            if v is None or isinstance(v, (dict, list, tuple, set)):
                raise TypeError(
                    f"add: {name} must be a str (or a number), got {type(v).__name__} ({v!r:.60})"
                )
            texts[name] = field_text(v, "add", name)
        why = self.task.unusable(texts["input"], texts["output"])
        if why:
            raise ValueError(f"add: {why}; a demonstration needs a non-empty input and output")
        texts = {k: v.strip() for k, v in texts.items()}
        ex = Example(len(self.pool), texts["input"], texts["output"], {})
        self.index.add(self.encoder.encode([self.encoder.demo(self.task, ex)], "prompt"))
        self.pool.append(ex)
        self._bm25.reset()
        if self.quality is not None:
            self.quality = np.append(np.asarray(self.quality), np.float32(np.mean(self.quality)))
        return ex.idx

    def scores_for(self, query: str, ids) -> np.ndarray:
        """``(len(ids),) float32`` inner products of ``query`` with those demonstrations (the trained encoder,
        whatever the mode)."""
        q = self.encoder.encode([query], "query")[0]
        p = self.encoder.encode([self.encoder.demo(self.task, self.pool[i]) for i in ids], "prompt")
        return p @ q
