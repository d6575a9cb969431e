"""Typed, frozen configuration: one dataclass per stage, filled from YAML plus ``--set a.b=v`` overrides.

Unknown keys are errors. A YAML file may name a parent with ``inherit: other.yaml`` (relative to itself).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

import yaml

from epr.types import ConfigError

__all__ = [
    "ExperimentConfig",
    "DataConfig",
    "ModelsConfig",
    "CandidatesConfig",
    "ScoringConfig",
    "LabelsConfig",
    "TrainConfig",
    "RetrieveConfig",
    "GenerateConfig",
    "RagsysConfig",
    "TruthfulQAConfig",
    "ServerConfig",
    "load_config",
    "config_from_dict",
]


@dataclass(frozen=True)
class DataConfig:
    task: str = "demo"
    data_dir: str | None = None  # local data folder (e.g. ../shared/data); None: packaged demo or the hub
    eval_size: int = 1000  # for tasks without a labelled held-out split: rows moved from pool to eval
    split_seed: int = 0
    pool_limit: int | None = None  # keep only the first N pool rows (after splitting)
    eval_limit: int | None = None  # evaluate on a fixed random subset of N eval rows (seeded)
    # dev: that subset (where every choice is made); locked: the rest of the eval split, evaluated once at the end
    eval_part: str = "dev"
    path: str | None = None  # generic task: the {input, output} JSONL/CSV file
    eval_path: str | None = None  # generic task: optional separate evaluation file
    input_field: str = "input"
    output_field: str = "output"


@dataclass(frozen=True)
class ModelsConfig:
    lm: str = "smollm2"  # scoring LM: packaged name, hub id or local directory
    inference_lm: str | None = None  # None: same as lm
    encoder: str = "minilm"  # dual-encoder init and SBERT baseline
    cache_dir: str | None = None  # where converted models live; default ~/.cache/epr (or $EPR_CACHE)
    dtype: str = "auto"  # auto | bf16 | fp32
    pack_linear: str = "auto"  # auto | on | off: LM linears pre-packed for oneDNN on CPU (auto: fp32 only)


@dataclass(frozen=True)
class CandidatesConfig:
    L: int = 50
    view: str = "output"  # output | input | input+output
    backend: str = "bm25s"  # bm25s | rank_bm25
    num_queries: int | None = None  # label only N pool examples (seeded subset); None: all
    query_seed: int = 0


@dataclass(frozen=True)
class ScoringConfig:
    batch_tokens: int = 4096  # padded tokens per forward pass
    chunk_size: int = 32  # training examples per resumable chunk
    forward: str = "fast"  # fast (epr.lm.fastlm, Llama-family) | hf (the transformers forward)
    compile: bool = False  # torch.compile the forward (one-off compile of minutes; pays off on long runs)
    prefix_share: bool = (
        True  # each demonstration's key/value cache computed once for all its [x][y] suffixes
    )


@dataclass(frozen=True)
class LabelsConfig:
    k_pos: int = 5
    k_neg: int = 5
    source: str = "lm"  # lm (EPR) | bm25 (DR-BM25 labels)


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 3
    batch_size: int = 32  # instances per optimizer step (effective batch, per process)
    chunk_size: int = 8  # GradCache sub-batch; 0 disables gradient caching
    lr: float = 2e-5
    warmup_ratio: float = 0.1
    weight_decay: float = 0.0
    loss: str = "epr"  # epr (the paper's) | listwise (UDR) | distill (LLM-R): epr/encoder/losses.py
    similarity: str = "dot"  # dot (EPR: raw inner product) | cosine (normalised embeddings / temperature)
    temperature: float | None = None  # divides the similarity; None: 1 for dot, 0.05 for cosine
    list_size: int = 8  # listwise / distill: scored candidates per instance per step (the best + a sample)
    loss_weight: float | None = None  # weight of the in-batch contrastive term; None: 1 listwise, 0.2 distill
    teacher_temperature: float = 1.0  # distill: softmax(LM score / this) is the target distribution
    best_by: str = "mrr"  # keep the epoch (0 = untrained) with the best dev metric: mrr | recall | last
    tie_encoders: bool = False
    max_length: int = 64
    grad_accum: int = 1
    mixed_precision: str = "no"  # no | bf16
    seed: int = 42
    dev_size: int = 100  # labelled instances held out for recall@k / MRR
    checkpoint_every: int = 0  # steps; 0: only at epoch ends


def train_temperature(tc: TrainConfig) -> float:
    """The similarity temperature in force: the configured one, or 1 (dot) / 0.05 (cosine)."""
    if tc.temperature is not None:
        return tc.temperature
    return 1.0 if tc.similarity == "dot" else 0.05


def train_loss_weight(tc: TrainConfig) -> float:
    """Weight of the in-batch contrastive term of the listwise / distill losses (UDR: 1, LLM-R: 0.2)."""
    if tc.loss_weight is not None:
        return tc.loss_weight
    return 0.2 if tc.loss == "distill" else 1.0


@dataclass(frozen=True)
class RetrieveConfig:
    retrievers: tuple[str, ...] = ("random", "bm25", "sbert", "epr", "bm25-oracle")
    k: int = 50  # retrieved before fitting into the prompt budget
    oracle_candidates: int | None = (
        None  # lm-oracle: BM25-Oracle candidates the LM re-ranks; None: candidates.L
    )
    index_factory: str = "Flat"  # faiss factory string, inner product
    prompt_budget: int = 768  # inference-LM tokens for demos + query + reserved answer room
    answer_reserve: int = 96
    max_demos: int = 16
    eval_limit: int | None = (
        None  # compare on a seeded subset of the eval split (the examples stage keeps all)
    )


@dataclass(frozen=True)
class GenerateConfig:
    max_new_tokens: int = 96
    batch_size: int = 8  # transformers' generate (engine hf, and models the lean decoder does not cover)
    chunk_size: int = 64  # prompts per resumable chunk
    engine: str = "auto"  # auto: the lean decoder (epr/lm/decode.py) where it covers the model, else hf
    decode_rows: int = 64  # lean decoder: rows decoded together
    prefill_tokens: int = 8192  # lean decoder: padded prompt tokens per prefill slice


@dataclass(frozen=True)
class RagsysConfig:
    k: int = 6
    lambda_d: float = 0.75
    lambda_b: float = 0.95


@dataclass(frozen=True)
class TruthfulQAConfig:
    """The TruthfulQA stages (epr/truthfulqa/stage.py); k, lambda_d and lambda_b come from ``ragsys``, the LM from
    ``models.lm`` / ``models.dtype``, the relevance encoder from ``models.encoder``, the files from ``data.data_dir``."""

    version: str = "2021-10"  # 2021-10 (SPEC 3.4) | v0 (the copy HF / lm-evaluation-harness use)
    variants: tuple[str, ...] = ("fix", "bias", "rel", "rel+bias", "rel+div", "rel+div+bias")
    limit: int | None = None  # a seeded subset (seed: ``seed``) of the 817 questions; the pool stays whole
    sweep: tuple[float, ...] = ()  # lambda_d values of the calibration sweep (rel+div+bias); empty: no sweep
    chunk_size: int = 32  # questions per resumable chunk of scores

    def __post_init__(self):
        from ragsys import VARIANTS

        known = ("fix", *VARIANTS)
        bad = [v for v in self.variants if v not in known]
        if bad or not self.variants or len(set(self.variants)) != len(self.variants):
            raise ConfigError(
                f"config truthfulqa.variants: {list(self.variants)}: distinct names of {list(known)}"
            )
        try:
            sweep = tuple(float(x) for x in self.sweep)
        except (TypeError, ValueError):
            raise ConfigError(
                f"config truthfulqa.sweep: {self.sweep!r}: expected numbers in [0, 1]"
            ) from None
        if any(not 0.0 <= x <= 1.0 for x in sweep):
            raise ConfigError(f"config truthfulqa.sweep: {list(sweep)}: lambda_d values must be in [0, 1]")
        object.__setattr__(self, "sweep", sweep)
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"config truthfulqa.limit={self.limit} must be >= 1 (or null: all questions)")
        if self.chunk_size < 1:
            raise ConfigError(f"config truthfulqa.chunk_size={self.chunk_size} must be >= 1")


@dataclass(frozen=True)
class ServerConfig:
    """An LM behind an OpenAI-compatible server (vLLM, llama.cpp, a provider's API: ``epr/lm/served.py``). With
    ``base_url`` set, scoring, the quality bias, TruthfulQA and generation go to the server; the local tokenizer of
    ``models.lm`` / ``models.inference_lm`` (or ``tokenizer``) turns texts into the token ids that are sent, so the
    scored tokens are exactly those of the in-process scorer."""

    base_url: str | None = None  # e.g. http://localhost:8000/v1; None: the LM runs in-process
    model: str | None = None  # the served scoring LM's name; None: the only model the server lists
    inference_model: str | None = None  # the served inference LM; None: ``model``
    tokenizer: str | None = (
        None  # local tokenizer matching the served model; None: models.lm's (inference_lm's)
    )
    api_key_env: str = (
        "OPENAI_API_KEY"  # the environment variable that holds the API key (unset: no key sent)
    )
    concurrency: int = 4  # requests in flight at once
    max_retries: int = (
        5  # per request, on 429 / 5xx / a refused or dropped connection, with exponential backoff
    )
    backoff_s: float = 1.0  # first retry's wait; doubles each retry (a Retry-After header wins)
    timeout_s: float = 300.0  # per request
    max_length: int | None = (
        None  # the served context window in tokens; None: the server's, else the model config's
    )

    def __post_init__(self):
        if self.concurrency < 1 or self.max_retries < 0 or self.backoff_s < 0 or self.timeout_s <= 0:
            raise ConfigError(
                "config server: concurrency must be >= 1, max_retries >= 0, backoff_s >= 0, timeout_s > 0"
            )
        if self.base_url is not None and not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"config server.base_url={self.base_url!r}: expected http(s)://host:port/v1")


@dataclass(frozen=True)
class ExperimentConfig:
    name: str = "demo"
    run_root: str = "runs"
    seed: int = 0
    data: DataConfig = field(default_factory=DataConfig)
    models: ModelsConfig = field(default_factory=ModelsConfig)
    candidates: CandidatesConfig = field(default_factory=CandidatesConfig)
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    labels: LabelsConfig = field(default_factory=LabelsConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    retrieve: RetrieveConfig = field(default_factory=RetrieveConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    ragsys: RagsysConfig = field(default_factory=RagsysConfig)
    truthfulqa: TruthfulQAConfig = field(default_factory=TruthfulQAConfig)
    server: ServerConfig = field(default_factory=ServerConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.run_root) / self.name

    def section(self, name: str) -> dict[str, Any]:
        return dataclasses.asdict(getattr(self, name))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_CHOICES = {
    ("candidates", "view"): {"output", "input", "input+output"},
    ("candidates", "backend"): {"bm25s", "rank_bm25"},
    ("labels", "source"): {"lm", "bm25"},
    ("models", "dtype"): {"auto", "bf16", "fp32"},
    ("models", "pack_linear"): {"auto", "on", "off"},
    ("generate", "engine"): {"auto", "lean", "hf"},
    ("data", "eval_part"): {"dev", "locked"},
    ("train", "mixed_precision"): {"no", "bf16"},
    ("train", "loss"): {"epr", "listwise", "distill"},
    ("train", "similarity"): {"dot", "cosine"},
    ("train", "best_by"): {"mrr", "recall", "last"},
    ("truthfulqa", "version"): {"2021-10", "v0"},
}


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = getattr(tp, "__origin__", None)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"config {where}: expected a mapping, got {value!r}")
        return config_from_dict(tp, value, where)
    if origin is tuple:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        elif not isinstance(value, (list, tuple)):
            value = [value]  # a single value (``--set truthfulqa.sweep=0.5``)
        return tuple(value)
    if value is None:
        if "None" in str(tp):
            return None
        raise ConfigError(f"config {where}: may not be null")
    for base in (bool, int, float, str):
        if (
            tp is base
            or (isinstance(tp, str) and tp.startswith(base.__name__))
            or str(tp).startswith(base.__name__)
        ):
            if base is bool and not isinstance(value, bool):
                raise ConfigError(f"config {where}: expected true/false, got {value!r}")
            if base is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"config {where}: expected an integer, got {value!r}")
            if base is float and isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as a string
                try:
                    value = float(value)
                except ValueError:
                    raise ConfigError(f"config {where}: expected a number, got {value!r}") from None
            if base is float and not isinstance(value, (int, float)):
                raise ConfigError(f"config {where}: expected a number, got {value!r}")
            return float(value) if base is float else value
    return value


def config_from_dict(cls: type, data: dict[str, Any], where: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``; unknown keys and wrong types raise ``ValueError`` naming the key."""
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"config {where or '<root>'}: unknown key(s) {unknown}; allowed: {sorted(known)}")
    kwargs = {}
    for name, value in data.items():
        key = f"{where}.{name}" if where else name
        kwargs[name] = _coerce(value, hints[name], key)
        allowed = _CHOICES.get(tuple(key.split(".")[-2:]))
        if allowed and kwargs[name] not in allowed:
            raise ConfigError(f"config {key}: {kwargs[name]!r} is not one of {sorted(allowed)}")
    return cls(**kwargs)


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"config {path}: inherit cycle")
    if not path.is_file():
        what = "a folder" if path.is_dir() else "no such file"
        raise ConfigError(f"config {path}: {what}; pass a YAML file with -c (for example configs/demo.yaml)")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(
            f"config {where}: not valid YAML ({problem}); fix the file (a `key: value` mapping)"
        ) from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config {path}: not UTF-8 (byte offset {e.start}); re-save it as UTF-8") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config {path}: top level must be a mapping")
    parent = data.pop("inherit", None)
    if parent:
        data = _deep_merge(_read_yaml(path.parent / parent, (*seen, path)), data)
    return data


def load_config(paths: Sequence[str | Path] = (), overrides: Sequence[str] = ()) -> ExperimentConfig:
    """Merge YAML files in order, then ``a.b=value`` overrides (values parsed as YAML)."""
    data: dict[str, Any] = {}
    for p in paths:
        data = _deep_merge(data, _read_yaml(Path(p)))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override --set {item!r}: expected key.path=value (e.g. candidates.L=20)")
        key, raw = item.split("=", 1)
        node = data
        parts = key.strip().split(".")
        if not all(parts):
            raise ConfigError(f"override --set {item!r}: {key!r} is not a key path (e.g. candidates.L=20)")
        for i, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(
                    f"override --set {item!r}: {'.'.join(parts[: i + 1])} is a value ({node!r}), not a section "
                    "with keys; set it directly (e.g. candidates.L=20)"
                )
        try:
            node[parts[-1]] = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ConfigError(
                f"override --set {item!r}: the value {raw!r} is not valid YAML ({problem}); "
                "quote it or close its brackets (e.g. retrieve.retrievers=[bm25,epr])"
            ) from None
    cfg = config_from_dict(ExperimentConfig, data)
    _validate(cfg)
    return cfg


RETRIEVERS = ("random", "bm25", "sbert", "epr", "dr-bm25", "bm25-oracle", "lm-oracle")
DENSE = ("sbert", "epr", "dr-bm25")


def _validate(cfg: ExperimentConfig) -> None:
    checks = [
        (cfg.candidates.L >= 1, "candidates.L must be >= 1"),
        (cfg.retrieve.k >= 1, f"retrieve.k={cfg.retrieve.k} must be >= 1 (ids retrieved per query)"),
        (cfg.retrieve.max_demos >= 1, f"retrieve.max_demos={cfg.retrieve.max_demos} must be >= 1"),
        (
            cfg.retrieve.prompt_budget >= 1,
            f"retrieve.prompt_budget={cfg.retrieve.prompt_budget} must be >= 1",
        ),
        (
            cfg.retrieve.answer_reserve >= 0,
            f"retrieve.answer_reserve={cfg.retrieve.answer_reserve} must be >= 0",
        ),
        (cfg.labels.k_pos >= 1 and cfg.labels.k_neg >= 1, "labels.k_pos and labels.k_neg must be >= 1"),
        (
            cfg.labels.k_pos + cfg.labels.k_neg <= cfg.candidates.L,
            f"labels.k_pos + labels.k_neg ({cfg.labels.k_pos}+{cfg.labels.k_neg}) must be <= candidates.L ({cfg.candidates.L})",
        ),
        (cfg.scoring.batch_tokens >= 16, "scoring.batch_tokens must be >= 16"),
        (
            cfg.scoring.forward in ("fast", "hf"),
            f"scoring.forward={cfg.scoring.forward!r} must be 'fast' or 'hf'",
        ),
        (0.0 <= cfg.ragsys.lambda_d <= 1.0, f"ragsys.lambda_d={cfg.ragsys.lambda_d} must be in [0, 1]"),
        (0.0 <= cfg.ragsys.lambda_b <= 1.0, f"ragsys.lambda_b={cfg.ragsys.lambda_b} must be in [0, 1]"),
        (cfg.train.batch_size >= 2, "train.batch_size must be >= 2 (in-batch negatives)"),
        (cfg.train.chunk_size >= 0, "train.chunk_size must be >= 0"),
        (cfg.train.list_size >= 2, "train.list_size must be >= 2"),
        (
            cfg.train.temperature is None or cfg.train.temperature > 0,
            "train.temperature must be > 0 (or null: 1 for dot, 0.05 for cosine)",
        ),
        (cfg.train.teacher_temperature > 0, "train.teacher_temperature must be > 0"),
    ]
    for name in cfg.retrieve.retrievers:
        base, *suffixes = name.split("+")
        checks.append(
            (
                base in RETRIEVERS and set(suffixes) <= {"div", "bias"},
                f"retrieve.retrievers: unknown retriever {name!r}; known: {', '.join(RETRIEVERS)}, "
                "with +div / +div+bias (RAGSys) after a dense one",
            )
        )
        checks.append(
            (
                not suffixes or base in DENSE,
                f"retrieve.retrievers: {name!r}: RAGSys re-ranking (+div, +bias) "
                f"needs a dense first stage ({', '.join(DENSE)})",
            )
        )
    for ok, msg in checks:
        if not ok:
            raise ConfigError(f"config: {msg}")
