"""What results are made of: statistics (``stats``: eval subsets, intervals, paired tests), rendering (``tables``:
Markdown / CSV / JSON / HTML / plots) and the machine line every result names (``machine``)."""
