"""Pipeline stages. Each takes a ``Context`` and writes one artifact folder that the next stage reads."""
