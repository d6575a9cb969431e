"""Write a random-init 2-layer sentence-transformers encoder (32-d, MiniLM's tokenizer) to a folder: what the GPU
checks (`tests/test_cuda.py`) use as ``EPR_TEST_ENCODER`` on a machine that lacks the packaged MiniLM's 90 MB.

    python scripts/make_tiny_encoder.py .gpu/tiny-encoder
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json", "modules.json")
FILES += ("sentence_bert_config.json", "config_sentence_transformers.json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="folder to write (replaced)")
    out = Path(ap.parse_args(argv).out)
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from epr.lm.models import resolve_encoder

    src = Path(resolve_encoder("minilm"))
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    tok = AutoTokenizer.from_pretrained(src)
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    )
    BertModel(cfg).save_pretrained(out)
    for name in FILES:
        shutil.copy(src / name, out / name)
    shutil.copytree(src / "1_Pooling", out / "1_Pooling")
    pool = json.loads((out / "1_Pooling" / "config.json").read_text())
    (out / "1_Pooling" / "config.json").write_text(json.dumps({**pool, "word_embedding_dimension": 32}))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
