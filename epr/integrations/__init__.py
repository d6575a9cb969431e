"""Adapters to the stacks practitioners already use (optional extras): ``epr.integrations.langchain``
(``pip install "epr[langchain]"``) and ``epr.integrations.dspy`` (``pip install "epr[dspy]"``)."""
