"""The configuration sections: one frozen dataclass per stage (``epr.config`` loads them; import from there). Every
field is declared once with :func:`opt`: its default, a one-line help text and, where the valid values are a finite
set, its choices: what the loader checks (``config_from_dict``) and ``epr config`` prints (docstring: heading)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from epr.config.names import (  # the names a config may choose from (retrievers, TruthfulQA variants), opt
    DENSE,
    MODEL,
    RETRIEVERS,
    SEED,
    TQA_LEARNED_VARIANTS,
    TQA_VARIANTS,
    RetrieverName,
    opt,
    parse_retriever_name,
    section_field,
)
from epr.config.prompt import PromptConfig
from epr.config.reward import RewardConfig
from epr.config.select import SelectConfig
from epr.config.server import ServerConfig
from epr.config.truthfulqa import RagsysConfig, TruthfulQAConfig
from epr.types import ConfigError

COLUMN = "a column name of the data file: the loader names the file's columns when it is missing"

__all__ = [
    "opt",
    "section_field",
    "ExperimentConfig",
    "DataConfig",
    "ModelsConfig",
    "CandidatesConfig",
    "ScoringConfig",
    "LabelsConfig",
    "TrainConfig",
    "RetrieveConfig",
    "SelectConfig",
    "GenerateConfig",
    "RagsysConfig",
    "TruthfulQAConfig",
    "ServerConfig",
    "RETRIEVERS",
    "DENSE",
    "RetrieverName",
    "parse_retriever_name",
    "TQA_VARIANTS",
    "TQA_LEARNED_VARIANTS",
]


@dataclass(frozen=True)
class DataConfig:
    """The task and its split into a pool (demonstrations, training) and the evaluated examples."""

    task: str = opt(
        "demo",
        "task name: mtop | break | smcalflow | demo | jsonl | truthfulqa (or one added by epr.tasks.register)",
        free="a registered task name, checked when the task is built (epr.tasks.get_task names the known ones)",
    )
    data_dir: str | None = opt(
        None, "local data folder (e.g. ../shared/data); null: packaged demo or the hub", path="path"
    )
    eval_size: int = opt(
        1000,
        "for tasks without a labelled held-out split: rows moved from pool to eval (jsonl task: at most a fifth)",
        ge=0,
    )
    split_seed: int = opt(0, "seed of the pool/eval split and of the data.eval_limit subset", **SEED)
    pool_limit: int | None = opt(None, "keep only the first N pool rows (after splitting); null: all", ge=1)
    eval_limit: int | None = opt(
        None, "evaluate on a fixed random subset of N eval rows (seeded); null: all", ge=1
    )
    eval_part: str = opt(
        "dev",
        "dev: that subset (where every choice is made); locked: the rest of the eval split, evaluated once at "
        "the end (needs data.eval_limit)",
        ("dev", "locked"),
    )
    eval_cut: str = opt(
        "rows",
        "how the dev part is cut from the eval split: rows, each drawn alone; groups, whole groups (SMCalFlow's "
        "dialogues) until data.eval_limit rows are reached, so dev and locked share no group",
        ("rows", "groups"),
    )
    hub_revision: str | None = opt(
        None,
        "where a task reads the hub (no data_dir): the dataset revision (commit, tag or branch) to load; pin it so a "
        "hub update makes the run stale instead of mixing versions; null: the newest, with a warning",
        free="a revision name, checked by the hub when the data is loaded",
    )
    path: str | None = opt(None, "generic task (jsonl): the {input, output} JSONL/CSV file", path="path")
    eval_path: str | None = opt(None, "generic task (jsonl): optional separate evaluation file", path="path")
    input_field: str = opt("input", "generic task (jsonl): the column holding the input", free=COLUMN)
    output_field: str = opt("output", "generic task (jsonl): the column holding the output", free=COLUMN)

    def __post_init__(self):
        if self.input_field == self.output_field:
            raise ConfigError(
                f"config data.input_field and data.output_field are both {self.input_field!r}: the retriever would "
                "learn to copy its input; name two different columns"
            )


@dataclass(frozen=True)
class ModelsConfig:
    """The scoring LM, the inference LM and the encoder, and how the LMs are loaded."""

    lm: str = opt("smollm2", "scoring LM: packaged name, hub id or local directory", free=MODEL)
    inference_lm: str | None = opt(None, "LM that answers the prompts; null: same as lm", free=MODEL)
    encoder: str = opt(
        "minilm", "dual-encoder init and SBERT baseline: packaged name, hub id or local directory", free=MODEL
    )
    cache_dir: str | None = opt(
        None, "where converted models live; null: ~/.cache/epr (or $EPR_CACHE)", path="path"
    )
    dtype: str = opt(
        "auto",
        "LM arithmetic; auto: bf16 where the hardware runs it fast, else fp32",
        ("auto", "bf16", "fp32"),
    )
    pack_linear: str = opt(
        "auto",
        "LM linears pre-packed for oneDNN on CPU (auto: fp32 only; epr/lm/cpu_linear.py)",
        ("auto", "on", "off"),
    )


@dataclass(frozen=True)
class CandidatesConfig:
    """BM25 candidates of each labelled pool example: the demonstrations the scoring LM ranks."""

    L: int = opt(50, "candidates per labelled example (each scored by the LM)", ge=1)
    view: str = opt("output", "the text BM25 matches over", ("output", "input", "input+output"))
    backend: str = opt("bm25s", "BM25 implementation", ("bm25s", "rank_bm25"))
    num_queries: int | None = opt(None, "label only N pool examples (seeded subset); null: all", ge=1)
    query_seed: int = opt(0, "seed of the candidates.num_queries subset", **SEED)
    miner: str = opt(
        "bm25",
        "how re-mined rounds mine (and round 1, with candidates.mine_run): retriever (iterative re-mining, UDR / "
        "LLM-R: a trained encoder, query tower on x, prompt tower on the pool) | mixed (the retriever's top "
        "ceil(L/2), then BM25's best not among them); bm25: re-mined rounds use retriever. Round 1 without "
        "mine_run: BM25 over candidates.view (EPR)",
        ("bm25", "retriever", "mixed"),
    )
    mine_run: str | None = opt(
        None,
        "miner=retriever or mixed: the run folder whose trained encoder mines round 1 (round r there; this run "
        "continues from r + 1)",
        path="path",
    )
    rounds: int = opt(
        2,
        "training rounds in this run: round r + 1's candidates are mined by round r's trained encoder; "
        "earlier rounds live in <run>/rounds/round-r/, the run's own stages are the last round",
        ge=1,
    )


@dataclass(frozen=True)
class ScoringConfig:
    """LM scoring of every (candidate, example) pair: the log-probability of the output after the demonstration."""

    batch_tokens: int | None = opt(
        None,
        "padded tokens per forward pass (null: 2048 on a CPU, 16384 on a GPU: epr.lm.identity.DEVICE_SIZES)",
        ge=16,
    )
    chunk_size: int = opt(
        128,
        "training examples per resumable chunk; with prefix_share, a larger chunk shares more demonstrations "
        "(fewer LM tokens) and loses more work when killed",
        ge=1,
    )
    forward: str = opt(
        "fast", "fast: epr.lm.fastlm (Llama-family); hf: the transformers forward", ("fast", "hf")
    )
    compile: bool = opt(False, "torch.compile the forward (a one-off compile of minutes: for long runs)")
    prefix_share: bool = opt(
        True, "each demonstration's key/value cache computed once for all its [x][y] suffixes"
    )
    int8: bool = opt(
        False,
        "the scoring LM's q/k/v and gate/up projections in int8 after SmoothQuant, on a CPU with VNNI / AMX-INT8 "
        "(else the dtype, with a message; keyed): ~1.2x bf16, labels Spearman 0.98 (epr/lm/int8_scoring.py)",
    )
    accept_devices: tuple[str, ...] = opt(
        (),
        "labels also take this LM's scores (same dtype, forward) from these devices' stores, any batch layout "
        "(bf16 rounding differs; keyed): a GPU lease's imported labels finished on a CPU",
        ("cpu", "cuda", "mps"),
    )


@dataclass(frozen=True)
class LabelsConfig:
    """Positives and hard negatives of each labelled example, from its ranked candidates."""

    k_pos: int = opt(5, "the top k_pos candidates are positives (k_pos + k_neg <= candidates.L)", ge=1)
    k_neg: int = opt(5, "the bottom k_neg candidates are hard negatives", ge=1)
    source: str = opt("lm", "ranking of the candidates: lm (EPR) | bm25 (DR-BM25 labels)", ("lm", "bm25"))


@dataclass(frozen=True)
class TrainConfig:
    """Dual-encoder training on the labels (epr/encoder/train.py, epr/encoder/losses.py)."""

    epochs: int = opt(3, "passes over the labelled examples (0: the untrained encoder)", ge=0)
    batch_size: int = opt(32, "instances per optimizer step (effective batch, per process)", ge=2)
    chunk_size: int = opt(8, "GradCache sub-batch; 0 disables gradient caching", ge=0)
    lr: float = opt(2e-5, "AdamW learning rate (linear schedule)", gt=0.0)
    warmup_ratio: float = opt(0.1, "fraction of the steps spent in linear warmup", ge=0.0, le=1.0)
    weight_decay: float = opt(0.0, "AdamW weight decay", ge=0.0)
    loss: str = opt(
        "distill",
        "epr (the paper's) | listwise (UDR) | distill (LLM-R): epr/encoder/losses.py",
        ("epr", "listwise", "distill"),
    )
    similarity: str = opt(
        "cosine",
        "dot (EPR: raw inner product) | cosine (normalised embeddings / temperature)",
        ("dot", "cosine"),
    )
    temperature: float | None = opt(None, "divides the similarity; null: 1 for dot, 0.05 for cosine", gt=0.0)
    list_size: int = opt(
        8, "listwise / distill: scored candidates per instance per step (the best + a sample)", ge=2
    )
    loss_weight: float | None = opt(
        None, "weight of the in-batch contrastive term; null: 1 listwise, 0.2 distill", ge=0.0
    )
    teacher_temperature: float = opt(
        1.0, "distill: softmax(teacher score / this) is the target distribution", gt=0.0
    )
    teacher: str = opt(
        "lm",
        "whose scores the listwise / distill losses learn: lm (the labels) | reward (the reward model's, over each "
        "labelled example's reward.teach_k mined candidates: LLM-R's distillation, the teacher stage)",
        ("lm", "reward"),
    )
    best_by: str = opt(
        "mrr",
        "keep the epoch (0 = untrained; never a warm-started round's starting encoder) with the best dev metric "
        "(last: the last epoch)",
        ("mrr", "recall", "last"),
    )
    tie_encoders: bool = opt(
        False, "one encoder for queries and demonstrations (false: two, both from models.encoder)"
    )
    max_length: int = opt(64, "encoder tokens per query / demonstration; 0: the data's longest, uncut", ge=0)
    demo_fields: str = opt(
        "input_output",
        "what of a demonstration the prompt tower reads: input and output (SPEC 2.4) or the input alone",
        ("input_output", "input"),
    )
    grad_accum: int = opt(1, "gradient accumulation steps", ge=1)
    length_buckets: int | None = opt(
        None,
        "without GradCache, a step's queries and demonstrations are length-sorted into this many sub-batches, each "
        "padded to its own longest: the same loss and gradient within float rounding, fewer padded tokens (1: one "
        "batch padded to its longest, as before the option; null: 4 on a CPU, where padded tokens cost time, 1 on a "
        "GPU, where each sub-batch's kernel launches do: epr.lm.identity.DEVICE_SIZES)",
        ge=1,
    )
    mixed_precision: str = opt(
        "auto",
        "accelerate's mixed precision (auto: bf16 where the hardware runs it fast, as models.dtype: auto; "
        "results/mtop-cheaper-training)",
        ("no", "bf16", "auto"),
    )
    init: str = opt(
        "previous",
        "what round r + 1 (candidates re-mined by round r's encoder) starts from: base (models.encoder) | previous "
        "(the mining round's trained encoder, a warm start)",
        ("base", "previous"),
    )
    warm_epochs: int | None = opt(
        1, "epochs of a warm-started round (train.init: previous); null: train.epochs", ge=1
    )
    seed: int = opt(42, "seed of the training order, the sampled documents and the dev split", **SEED)
    dev_size: int = opt(100, "labelled instances held out for recall@k / MRR (0: none)", ge=0)
    checkpoint_every: int = opt(0, "steps between checkpoints; 0: only at epoch ends", ge=0)


@dataclass(frozen=True)
class RetrieveConfig:
    """The compared retrievers and the prompts they fill for the inference LM."""

    retrievers: tuple[str, ...] = opt(
        ("random", "bm25", "sbert", "epr", "hybrid", "bm25-oracle"),
        f"compared retrievers: {' | '.join(RETRIEVERS)}; a dense one ({', '.join(DENSE)}) may add RAGSys "
        "re-ranking as +div or +div+bias; a ranking one the reward model's re-ranking as +rm (epr/reward/)",
        free="names checked at load: a known first stage each, +div / +div+bias only after a dense one",
    )
    k: int = opt(50, "retrieved before fitting into the prompt budget", ge=1)
    oracle_candidates: int | None = opt(
        None, "lm-oracle: BM25-Oracle candidates the LM re-ranks; null: candidates.L", ge=1
    )
    index_factory: str = opt(
        "Flat",
        "faiss factory string, inner product",
        free="faiss's own grammar: faiss checks it when it builds",
    )
    prompt_budget: int = opt(768, "inference-LM tokens for demos + query + reserved answer room", ge=1)
    answer_reserve: int = opt(96, "tokens of prompt_budget kept free for the answer", ge=0)
    max_demos: int = opt(
        16, "demonstrations per prompt at most (also what +div / +div+bias re-ranking selects)", ge=1
    )
    eval_limit: int | None = opt(
        None,
        "compare on a seeded subset (seed: the top-level seed) of the eval split (the examples stage keeps all)",
        ge=1,
    )


@dataclass(frozen=True)
class GenerateConfig:
    """Greedy generation of the answers to the prompts."""

    max_new_tokens: int = opt(96, "tokens generated per answer at most", ge=1)
    batch_size: int = opt(
        8, "transformers' generate (engine hf, and models the lean decoder does not cover)", ge=1
    )
    chunk_size: int | None = opt(
        None,
        "prompts per resumable chunk (null: 256 on a CPU, 1024 on a GPU; the lean decoder batches continuously within "
        "a chunk: fewer than ~4x decode_rows leave its steps with few rows; part of predict's key, since in bf16 "
        "the batching moves outputs: a change regenerates)",
        ge=1,
    )
    engine: str = opt(
        "auto",
        "auto: the lean decoder (epr/lm/decode.py) where it covers the model, else hf; lean: the lean decoder or an "
        "error; hf: transformers' generate",
        ("auto", "lean", "hf"),
    )
    decode_rows: int | None = opt(
        None,
        "lean decoder: rows decoded together at most (groups of a quarter join as rows finish; null: 64 on a CPU, "
        "256 on a GPU)",
        ge=1,
    )
    prefill_tokens: int = opt(8192, "lean decoder: padded prompt tokens per prefill slice", ge=1)


@dataclass(frozen=True)
class ExperimentConfig:
    """One experiment: a run folder (``<run_root>/<name>``) and one section per stage."""

    name: str = opt(
        "demo",
        "the run's name: its outputs go to <run_root>/<name> (a -c config that sets none: its file's name)",
        path="run-name",
    )
    run_root: str = opt(
        "runs", "folder of the runs and of the caches they share (scores, quality bias)", path="path"
    )
    seed: int = opt(
        0,
        "seed of the random retriever and of the retrieve.eval_limit / truthfulqa.limit subsets",
        **SEED,
    )
    data: DataConfig = section_field(DataConfig)
    models: ModelsConfig = section_field(ModelsConfig)
    candidates: CandidatesConfig = section_field(CandidatesConfig)
    scoring: ScoringConfig = section_field(ScoringConfig)
    labels: LabelsConfig = section_field(LabelsConfig)
    train: TrainConfig = section_field(TrainConfig)
    reward: RewardConfig = section_field(RewardConfig)
    retrieve: RetrieveConfig = section_field(RetrieveConfig)
    select: SelectConfig = section_field(SelectConfig)
    generate: GenerateConfig = section_field(GenerateConfig)
    prompt: PromptConfig = section_field(PromptConfig)
    ragsys: RagsysConfig = section_field(RagsysConfig)
    truthfulqa: TruthfulQAConfig = section_field(TruthfulQAConfig)
    server: ServerConfig = section_field(ServerConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.run_root) / self.name

    def section(self, name: str) -> dict[str, Any]:
        return asdict(getattr(self, name))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
