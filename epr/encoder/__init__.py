"""The dual encoder and how it learns from the LM's scores.

- ``model``: ``DualEncoder`` (query and prompt towers, pooling, similarity);
- ``losses``: the contrastive losses (epr, listwise, distill) as pure functions, and GradCache;
- ``data``: training instances from labels, demonstration text; ``dev_metric``: recall / MRR on held-out labels;
- ``train``: the training loop (accelerate, 1 or N processes); ``checkpoints``: resumable checkpoints;
- ``settings``: the training settings as they act (precision resolved, a warm round's epochs), torch-free.
"""
