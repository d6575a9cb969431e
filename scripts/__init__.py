"""One-off and reporting scripts, the top layer (they import ``epr``; ``epr`` never imports them). Run from the
repository root: ``python -m scripts.<name>`` imports this checkout's ``epr``; ``python scripts/<name>.py`` the
installed one (``pip install -e .``). None edits ``sys.path`` (tests/test_layers.py)."""
