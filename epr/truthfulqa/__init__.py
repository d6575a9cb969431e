"""TruthfulQA with RAGSys demonstrations (SPEC 3.3-3.5).

- ``sets``: D_MC / D_ICL / D_DPO, prompt formats (``epr.tasks.qa_format``, shared with the task), the LM quality
  bias, context selection;
- ``stats``: paired intervals and verdicts; ``findings``: the paper's three findings across LMs;
- ``stage``: the pipeline's TruthfulQA stages; ``report``: their tables (the command, ``epr truthfulqa``, is
  ``epr.cli.truthfulqa``);
- ``learned``: ``tqa_labels`` / ``tqa_encoders`` (EPR's labels and k-fold dual encoders as relevance);
  ``common``: the keys, cache folders and scorer the stages share.
"""
