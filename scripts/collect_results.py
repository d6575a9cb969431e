"""Moved to ``epr.experiments.collect_results`` (in the package, under the layer test); this path keeps the commands recorded in
the results folders working, with the same options and outputs."""

from epr.experiments.collect_results import main

if __name__ == "__main__":
    raise SystemExit(main())
