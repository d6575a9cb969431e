"""Retrieval: from a query to the demonstrations in its prompt.

- ``bm25``: BM25 (candidate mining over outputs, and the BM25 baseline); ``index``: faiss MIPS indexes;
- ``retrievers``: every retriever by name (random, bm25, dr-bm25, sbert, epr, hybrid, the oracles), ``make_retriever``;
- ``ragsys``: RAGSys re-ranking (relevance + MMR diversity + LM quality bias, SPEC Algorithm 1) and retriever names
  such as ``epr+div+bias``;
- ``modes``: what a served retriever (``epr.api.PromptRetriever``) ranks by: ``epr``, ``hybrid`` or ``bm25``;
- ``prompt_budget``: prompts that fill the inference LM's context, counted in its own tokens.
"""
