"""The reward model (issue 74; LLM-R's, Wang et al. 2023): a cross-encoder that reads a query and a demonstration
together and scores how much the demonstration helps the LM answer the query. Trained on the LM's scores of every
labelled candidate with a listwise loss (:mod:`epr.reward.train`), it re-ranks a first stage's top K
(:func:`epr.reward.model.rerank`)."""

from epr.reward.model import CrossEncoder, rerank

__all__ = ["CrossEncoder", "rerank"]
