"""Shared fixtures: a tiny random-init causal LM (milliseconds) and tiny data with known answers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def minilm_dir() -> str:
    """The packaged MiniLM, or the local encoder folder ``EPR_TEST_ENCODER`` names (a GPU machine without it)."""
    from epr.lm.models import resolve_encoder

    return os.environ.get("EPR_TEST_ENCODER") or resolve_encoder("minilm")


@pytest.fixture(scope="session")
def tiny_lm_dir(tmp_path_factory, minilm_dir) -> str:
    """A 2-layer Llama with MiniLM's tokenizer, saved like any local model folder."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(minilm_dir)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(cfg)
    out = tmp_path_factory.mktemp("tiny_lm")
    model.save_pretrained(out)
    # copy the tokenizer files: transformers 5 cannot reload this BertTokenizer after save_pretrained
    import shutil

    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(Path(minilm_dir) / name, out / name)
    return str(out)


@pytest.fixture(scope="session")
def tiny_lm(tiny_lm_dir):
    from epr.lm.models import load_lm

    return load_lm(tiny_lm_dir, dtype="fp32")


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def tiny_task_files(tmp_path) -> Path:
    """24 pool + 6 eval rows of a toy parser in the demo task's layout (the eval rows' verb is not in the pool)."""
    return write_tiny_task(tmp_path)


def write_tiny_task(tmp_path: Path) -> Path:
    """The files of :func:`tiny_task_files` in ``tmp_path``."""
    verbs = ["turn on", "turn off", "dim", "check", "toggle"]
    rooms = ["kitchen", "garage", "office", "attic", "porch", "den"]
    rows = [
        {"input": f"{v} the {r} lights", "output": f"[IN:{v.upper().replace(' ', '_')} [SL:ROOM {r} ] ]"}
        for v in verbs
        for r in rooms
    ]
    write_rows(tmp_path / "demo.pool.jsonl", rows[:24])
    write_rows(tmp_path / "demo.eval.jsonl", rows[24:])
    return tmp_path


def torchrun(args: list[str], port: int, env: dict | None = None, timeout: int = 600):
    """Run ``args`` (a script path or ``-m module`` and its arguments) as 2 CPU processes under torchrun (gloo);
    on CPU accelerate's own launcher starts one process, torchrun sets the env Accelerator reads."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]
    return subprocess.run(
        [*cmd, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "ACCELERATE_USE_CPU": "1", **(env or {})},
    )


@pytest.fixture(scope="session")
def shipped(tmp_path_factory, minilm_dir, tiny_lm_dir):
    """A retriever trained on tiny own data (tiny LM) and written by `epr export`, as the README runs it; and the
    run's evaluation inputs. The LangChain and dspy adapters load it."""
    from epr import pipeline
    from epr.context import Context

    from .test_own_data import own_config

    tmp = tmp_path_factory.mktemp("shipped")
    runs = tmp / "runs"  # the run root; the export goes beside it (never into a run root)
    runs.mkdir()
    ctx = Context(
        own_config(runs, minilm_dir, f"models.lm={tiny_lm_dir}", "retrieve.retrievers=[epr+div+bias]")
    )
    pipeline.run(ctx, until="rerank")
    from epr.cli import main  # `epr export`, as the README runs it

    out = tmp / "shipped"
    assert main(["export", "--set", f"run_root={runs}", "--set", "name=mine", str(out)]) == 0
    assert "Dev metrics per epoch" in (out / "README.md").read_text()
    return out, [e.input for e in ctx.examples("eval")]


# a ChatML-like template over MiniLM's special tokens ([CLS] opens a turn, [SEP] ends it), with a default system
# message as SmolLM2's template has one: the tiny LM prompted as a chat model
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}[CLS]system\nyou parse commands[SEP]\n"
    "{% endif %}[CLS]{{ m['role'] }}\n{{ m['content'] }}[SEP]\n{% endfor %}"
    "{% if add_generation_prompt %}[CLS]assistant\n{% endif %}"
)


@pytest.fixture(scope="session")
def tiny_chat_lm_dir(tmp_path_factory, tiny_lm_dir) -> str:
    """The tiny LM with a chat template in its tokenizer (a chat model's folder, as a hub chat model ships)."""
    import shutil

    out = tmp_path_factory.mktemp("tiny_chat_lm") / "lm"
    shutil.copytree(tiny_lm_dir, out)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg["chat_template"] = TINY_CHAT_TEMPLATE
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    return str(out)
