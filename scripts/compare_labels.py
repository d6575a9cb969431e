"""Moved to ``epr.experiments.compare_labels`` (in the package, under the layer test); this path keeps the commands recorded in
the results folders working, with the same options and outputs."""

from epr.experiments.compare_labels import main

if __name__ == "__main__":
    raise SystemExit(main())
