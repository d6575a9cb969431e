"""The model card (README.md) of a shipped retriever: what it was trained on, with which LM and loss, how it did."""

from __future__ import annotations

import json
from pathlib import Path

from epr.cache import read_manifest
from epr.config.names import base_mode, is_reranked

__all__ = ["model_card", "run_card", "served_section", "restate_served"]

# the served-retriever section is kept between these, so a resave with another mode restates it
_BEGIN, _END = "<!-- epr:served -->", "<!-- /epr:served -->"
_RANKS = {
    "epr": "the trained dual encoder (inner product over the faiss index)",
    "hybrid": "the trained dual encoder's ranking fused with BM25 (`{b}`) over the demonstrations' inputs by "
    "reciprocal rank (RRF, c = 60)",
    "bm25": "BM25 (`{b}`) over the demonstrations' inputs; the trained encoder does not rank",
}


def _num(v, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) and not isinstance(v, bool) else "–"


def served_section(meta: dict) -> str:
    """Which retriever the folder serves (``meta["mode"]``, ``epr`` for folders written before modes) and, where
    the run's ``select`` stage chose it, why and the numbers it compared on the held-out slice of the pool."""
    mode, sel = meta.get("mode", "epr"), meta.get("selection") or {}
    ranks = _RANKS[base_mode(mode)].format(b=meta.get("bm25_backend", "bm25s"))
    if is_reranked(mode):
        ranks += (f", its top {(meta.get('reward') or {}).get('top_k', '?')} re-ordered by the trained reward model "
                  "(a cross-encoder reading the query and each demonstration together, in `reward/`)")  # fmt: skip
    lines = [_BEGIN, f"## Served retriever: `{mode}`", "",
             f"`retrieve()`, `select()` and the LangChain and dspy adapters rank the pool by {ranks}. "
             "`EPREmbeddings` and RAGSys re-ranking use the trained encoder whatever the mode.", ""]  # fmt: skip
    if not sel:
        lines += ["No selection against BM25 was run for it (the run had no `select` stage).", ""]
        return "\n".join([*lines, _END, ""])
    chosen, base = sel.get("selected"), sel.get("baseline", "bm25")
    if chosen == "bm25":
        lines += ["**No learned retriever beat BM25 on your pool**: neither the trained encoder (`epr`) nor its "
                  "fusion with BM25 (`hybrid`) did better than BM25 on the held-out queries of your pool "
                  "by the selection rule, so BM25 was selected.", ""]  # fmt: skip
    if chosen != mode:
        lines += [f"Served by choice: the run's `select` stage chose `{chosen}`.", ""]
    rule = f" (rule: {sel['rule']})" if sel.get("rule") else ""
    lines += [f"Selection (the run's `select` stage): {sel.get('reason', '')}{rule}", "",
              f"Compared on {sel.get('n', '?')} held-out queries of the training pool (the LM's log-probability "
              f"of the gold output with each retriever's demonstrations, paired against `{base}`):", "",
              f"| retriever | gold log-prob | gain vs {base} | p vs {base} |", "|---|---|---|---|"]  # fmt: skip
    for name, row in (sel.get("rows") or {}).items():
        mark = " (served)" if name == mode else " (selected)" if name == chosen else ""
        lines.append(f"| `{name}`{mark} | {_num(row.get('gold_logprob'), '.3f')} | "
                     f"{_num(row.get('gain'), '+.3f')} | {_num(row.get('p'), '.3g')} |")  # fmt: skip
    return "\n".join([*lines, "", _END, ""])


def restate_served(card: str, meta: dict) -> str:
    """``card`` with its served-retriever section replaced by ``meta``'s (a retriever saved again after its mode
    changed); a card without one (written before modes) gets it appended unless it serves ``epr``."""
    if _BEGIN in card and _END in card:
        head, rest = card.split(_BEGIN, 1)
        return head + served_section(meta).rstrip("\n") + rest.split(_END, 1)[1]
    return card if meta.get("mode", "epr") == "epr" else card.rstrip("\n") + "\n\n" + served_section(meta)


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
        "A dual encoder trained with `epr`, the method of Rubin et al. 2022 ([*Learning To Retrieve Prompts for "
        "In-Context Learning*](https://aclanthology.org/2022.naacl-main.191/)), to pick the training examples to put in a language model's prompt, with its "
        "demonstration pool and faiss index.",
        "",
        "```python",
        "from epr.api import PromptRetriever",
        "r = PromptRetriever.from_pretrained('path/to/this/folder')",
        "print(r.retrieve('your query').prompt)",
        "```",
        "",
        served_section(meta),
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
        prompt_line(meta.get("prompt")),
        "",
    ]
    return "\n".join(lines) + "\n"


def prompt_line(p: dict | None) -> str:
    """The card's line on the prompt format the labels were scored in and the retriever renders."""
    if not p or all(
        p.get(k) in (None, False) for k in ("instruction", "demo", "query", "target", "chat", "system")
    ):
        return (
            "- Prompt format: the task's own (input<TAB>output per demonstration, the query then input<TAB>)."
        )
    shown = {k: p[k] for k in ("instruction", "demo", "query", "target", "system") if p.get(k) is not None}
    how = (
        f"chat (the LM's chat template, few-shot {'as multi-turn' if p.get('multiturn') else 'in one user turn'}; "
        f"replies end at `{p.get('end_of_turn')}`)"
        if p.get("chat")
        else "raw text"
    )
    return (
        f"- Prompt format: {how}; "
        + (", ".join(f"{k} `{json.dumps(v)}`" for k, v in shown.items()) or "the task's templates")
        + ". The labels were scored, and the retriever renders, in this format."
    )


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
            f"`{t.get('loss')}`, {t.get('epochs')} epoch{'' if t.get('epochs') == 1 else 's'}, "
            f"batch {t.get('batch_size')}, lr {t.get('lr')}"
        )
    if sc:
        info["Labels scored by"] = f"`{json.dumps(sc.get('lm', sc.get('models', sc)), sort_keys=True)[:200]}`"
    card = model_card(meta, info)
    hist = run / "encoder" / "history.json"
    if hist.exists():
        h = json.loads(hist.read_text(encoding="utf-8"))
        if isinstance(h, list) and h:
            cols = [k for k in h[0] if k != "epoch"]
            card += "\n## Dev metrics per epoch (epoch 0: before training, the base encoder or an earlier round's)\n\n"
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
