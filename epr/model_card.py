"""The model card (README.md) of a shipped retriever: what it was trained on, with which LM and loss, how it did."""

from __future__ import annotations

import json
from pathlib import Path

from epr.cache import read_manifest

__all__ = ["model_card", "run_card"]


def model_card(meta: dict, run: dict) -> str:
    """README.md of a shipped retriever: what it was trained on, with which LM and loss, how it did."""
    t, b, rs = meta["task"], meta["budget"], meta["ragsys"]
    lines = [
        "---",
        "library_name: epr",
        "tags: [in-context-learning, prompt-retrieval, dense-retrieval, epr]",
        "---",
        "",
        f"# EPR prompt retriever: `{t.get('task')}`",
        "",
        "A dual encoder trained with [epr](https://github.com/) (Rubin et al. 2022, *Learning To Retrieve Prompts for "
        "In-Context Learning*) to pick the training examples to put in a language model's prompt, with its "
        "demonstration pool and faiss index.",
        "",
        "```python",
        "from epr.api import PromptRetriever",
        "r = PromptRetriever.from_pretrained('path/to/this/folder')",
        "print(r.retrieve('your query').prompt)",
        "```",
        "",
        "## Training",
        "",
        f"- Data: task `{t.get('task')}`, {meta['pool_size']} demonstrations in the pool"
        + (f" (from `{t.get('path')}`)" if t.get("path") else "")
        + ".",
    ]
    for k, v in run.items():
        lines.append(f"- {k}: {v}")
    lines += [
        f"- Prompt rules: {b['prompt_budget']} tokens of `{b['tokenizer_name']}` ({b['answer_reserve']} kept for the "
        f"answer), at most {b['max_demos']} demonstrations, the best right before the query; k = {b['k']}.",
        f"- RAGSys re-ranking: k = {rs.get('k')}, lambda_d = {rs.get('lambda_d')}, lambda_b = {rs.get('lambda_b')}; "
        f"quality bias {'included' if meta['quality_bias'] else 'not computed by the run'}.",
        "",
    ]
    return "\n".join(lines) + "\n"


def run_card(run: Path, meta: dict) -> str:
    """The model card of a run's retriever: base encoder, loss, the scoring LM, the training history (dev metrics
    per epoch) and the run's comparison table when it has one."""
    enc = (read_manifest(run / "encoder") or {}).get("config", {})
    sc = (read_manifest(run / "scores") or {}).get("config", {})
    info = {}
    if enc:
        t = enc.get("train", {})
        info["Base encoder"] = f"`{enc.get('encoder')}`"
        info["Loss"] = (
            f"`{t.get('loss')}`, {t.get('epochs')} epochs, batch {t.get('batch_size')}, lr {t.get('lr')}"
        )
    if sc:
        info["Labels scored by"] = f"`{json.dumps(sc.get('lm', sc.get('models', sc)), sort_keys=True)[:200]}`"
    card = model_card(meta, info)
    hist = run / "encoder" / "history.json"
    if hist.exists():
        h = json.loads(hist.read_text(encoding="utf-8"))
        if isinstance(h, list) and h:
            cols = [k for k in h[0] if k != "epoch"]
            card += "\n## Dev metrics per epoch (epoch 0: the untrained encoder)\n\n"
            card += "| epoch | " + " | ".join(cols) + " |\n|" + "---|" * (len(cols) + 1) + "\n"
            for row in h:
                cells = [
                    f"{row.get(c):.4g}" if isinstance(row.get(c), float) else str(row.get(c)) for c in cols
                ]
                card += f"| {row.get('epoch')} | " + " | ".join(cells) + " |\n"
    res = run / "evaluate" / "results.md"
    if res.exists():
        card += "\n## The run's comparison\n\n" + res.read_text(encoding="utf-8").replace("# ", "### ", 1)
    return card
