"""The learning curve, now ``epr experiment curve`` (``epr.experiments.curve``): this path keeps the commands recorded
in the results folders (``python scripts/learning_curve.py ...``) working, with the same options and outputs."""

from epr.experiments.curve import main

if __name__ == "__main__":
    raise SystemExit(main())
