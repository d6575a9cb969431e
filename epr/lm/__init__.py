"""The language-model stack: everything that runs or talks to an LM.

- ``models``: resolve a name (packaged, hub id, local folder) and load the LM / encoder in a dtype;
- ``factory``: the one place that turns ``cfg.models`` / ``cfg.scoring`` / ``cfg.server`` into an ``LMSpec`` and
  builds the run's scorer or generator from it (every cache key is built from the same spec);
- ``scoring``: ``LMScorer`` (log p(target | context), token-budget batches, and the one shared-prefix engine: a
  prefix's keys and values computed once for every sequence that starts with it); ``fastlm``: the lean Llama forward;
  ``cpu_linear``: oneDNN-packed linears;
- ``score_cache``: the content-keyed store of LM scores shared by runs;
- ``generate`` / ``decode``: greedy generation (transformers, or the lean decoder);
- ``served`` / ``llamacpp_server``: LMs behind an OpenAI-compatible server, and ``epr serve``.
"""
