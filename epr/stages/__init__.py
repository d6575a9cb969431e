"""Pipeline stages. Each ``run_<stage>(ctx, out, fp)`` takes a ``Context``, its output folder and its fingerprint,
and writes one artifact folder that the next stage reads; ``epr.pipeline.STAGES`` wires them. Stage modules import
torch and the models inside their functions, so ``epr status`` stays fast.

front half: examples -> candidates -> scores -> labels -> encoder      (dr-bm25: a sub-run with BM25 labels)
back half:  retrieve -> rerank -> prompts -> predict -> evaluate
"""
