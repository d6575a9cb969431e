"""The learning curve's former name: ``scripts/learning_curve.py`` (the commands recorded in results/ and in older
notes call this one). Runs it with the same arguments."""

import runpy
from pathlib import Path

if __name__ == "__main__":
    runpy.run_path(str(Path(__file__).with_name("learning_curve.py")), run_name="__main__")
