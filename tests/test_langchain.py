"""The LangChain adapters with the real langchain-core: the selector inside FewShotPromptTemplate picks what the
retriever picks, RAGSys's lambdas pass through, add_example needs no retraining, and the Embeddings are the towers."""

import numpy as np
import pytest

from tests.extras import need

need("langchain_core")

from langchain_core.prompts import FewShotPromptTemplate, PromptTemplate  # noqa: E402
from langchain_core.vectorstores import InMemoryVectorStore  # noqa: E402

from epr.api import PromptRetriever  # noqa: E402
from epr.integrations.langchain import EPREmbeddings, EPRExampleSelector  # noqa: E402


def test_selector_in_a_few_shot_prompt_is_the_retrievers_choice(shipped):
    path, queries = shipped
    r = PromptRetriever.from_pretrained(path)
    sel = EPRExampleSelector(r, k=3)
    prompt = FewShotPromptTemplate(
        example_selector=sel,
        example_prompt=PromptTemplate.from_template("{input} => {output}"),
        suffix="{input} =>",
        input_variables=["input"],
    )
    for q in queries[:4]:
        want = r.retrieve(q, k=3).demos  # best first
        text = prompt.format(input=q)
        assert text == "\n\n".join([f"{d.input} => {d.output}" for d in want[::-1]] + [f"{q} =>"])
    best_first = EPRExampleSelector(r, k=3, order="best_first").select_examples({"input": queries[0]})
    assert [e["input"] for e in best_first] == [d.input for d in r.retrieve(queries[0], k=3).demos]


def test_ragsys_lambdas_pass_through(shipped):
    from ragsys import mmr_select

    path, queries = shipped
    r = PromptRetriever.from_pretrained(path)
    assert r.quality is not None
    sel = EPRExampleSelector(r, k=4, lambda_d=0.3, lambda_b=0.5, shortlist=len(r.pool))
    q = queries[0]
    emb = np.stack([r.index.reconstruct(i) for i in range(len(r.pool))])
    qe = r.encoder.encode([q], "query")[0]
    from epr.retrieval.index import search

    order = search(r.index, qe[None], len(r.pool))[0][0]  # the shortlist: every demo, best first
    want = order[mmr_select(qe, emb[order], r.quality[order], 4, 0.3, 0.5)].tolist()
    assert sel.select_ids(q) == want
    assert sel.select_ids(q) != EPRExampleSelector(r, k=4).select_ids(q)  # the lambdas change the choice
    with pytest.raises(ValueError, match="quality bias"):
        r.quality = None
        EPRExampleSelector(r, lambda_b=0.5)


def test_add_example_is_retrievable_without_retraining(shipped):
    import asyncio

    path, _ = shipped
    r = PromptRetriever.from_pretrained(path)
    sel = EPRExampleSelector(r, k=1)
    n = len(r.pool)
    new = {"input": "zebra xylophone quantum banana", "output": "a brand new demonstration"}
    assert asyncio.run(sel.aadd_example(new)) == str(n)
    assert len(r.pool) == n + 1 and r.index.ntotal == n + 1 and len(r.quality) == n + 1
    got = asyncio.run(sel.aselect_examples({"input": new["input"]}))
    assert got == [new]  # its own input finds it (the query and demonstration towers are initialised alike)


def test_embeddings_are_the_two_towers_in_a_vector_store(shipped):
    path, queries = shipped
    r = PromptRetriever.from_pretrained(path)
    emb = EPREmbeddings(r)
    docs = [emb.document({"input": e.input, "output": e.output}) for e in r.pool]
    # a document is embedded as the retriever's own index holds that demonstration (the demonstration tower over
    # the training-time text), a query with the query tower
    indexed = np.stack([r.index.reconstruct(i) for i in range(3)])
    np.testing.assert_allclose(emb.embed_documents(docs[:3]), indexed, rtol=1e-4, atol=1e-5)
    q = np.asarray(emb.embed_query(queries[0]))
    np.testing.assert_allclose(q, r.encoder.encode(queries[:1], "query")[0], rtol=1e-5)
    assert not np.allclose(q, np.asarray(emb.embed_documents([queries[0]])[0]), atol=1e-3)  # two towers
    store = InMemoryVectorStore(embedding=emb)
    store.add_texts(docs, ids=[str(e.idx) for e in r.pool])
    hits = store.similarity_search(queries[0], k=5)
    d = np.stack([r.index.reconstruct(i) for i in range(len(r.pool))])
    cos = d @ q / (np.linalg.norm(d, axis=1) * np.linalg.norm(q))  # the store ranks by cosine
    assert [h.id for h in hits] == [str(r.pool[i].idx) for i in np.argsort(-cos, kind="stable")[:5]]


def test_readme_snippet_runs(shipped, capsys):
    """The README's "Use it in your stack" LangChain snippet, run as written on a shipped retriever."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Use it in your stack", 1)[1].split("\n## ", 1)[0]
    code = [c for c in re.findall(r"```python\n(.*?)```", section, re.S) if "few_shot_prompt" in c]
    assert len(code) == 1
    path, queries = shipped
    exec(code[0].replace('"my-retriever"', repr(str(path))), {})
    out = capsys.readouterr().out
    r = PromptRetriever.from_pretrained(path)
    want = "".join(
        f"{d.input}\t{d.output}\n" for d in r.retrieve("wake me up at 7 tomorrow", k=4).demos[::-1]
    )
    # not the top 4 by rank alone: RAGSys's lambda_d re-ranks; 4 demonstrations in the run's format, then the query
    assert out.endswith("wake me up at 7 tomorrow\t\n") and out.count("\t") == 5 and out.count("\n") == 5
    assert want.count("\n") == 4


@pytest.mark.parametrize("mode", ["bm25", "hybrid"])
def test_selector_serves_the_retrievers_mode(shipped, mode):
    """The selector picks by the retriever's served mode (BM25 over the inputs, or its fusion with the dense
    ranking); the Embeddings stay the trained towers whatever the mode."""
    from epr.retrieval.index import search
    from epr.retrieval.retrievers import BM25Retriever, rrf_fuse
    from epr.types import Example

    path, queries = shipped
    r = PromptRetriever.from_pretrained(path)
    bm25 = BM25Retriever(r.pool, "input", "bm25s")

    def dense(q):
        return search(r.index, r.encoder.encode([q], "query"), 3)[0][0]

    r.mode = mode
    sel, differs = EPRExampleSelector(r, k=3), 0
    for q in queries:
        b = bm25.retrieve([Example(-1, q, "", {})], 3).ids[0]
        want = b if mode == "bm25" else rrf_fuse([dense(q), b], 3)[0]
        assert sel.select_ids(q) == want.tolist()
        assert [e["input"] for e in sel.select_examples({"input": q})] == [
            r.pool[i].input for i in want[::-1]
        ]
        differs += want.tolist() != dense(q).tolist()
    assert differs  # not the dense ranking
    emb = EPREmbeddings(r)
    np.testing.assert_allclose(
        emb.embed_query(queries[0]), r.encoder.encode(queries[:1], "query")[0], rtol=1e-5
    )
