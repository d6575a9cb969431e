"""Stage ``encoder``: train the dual encoder by running ``training/train_epr.py`` on this run's config.

The stage hands the resolved config to the script (one process). For several processes or GPUs, run
``accelerate launch training/train_epr.py -c <config>`` yourself: it writes the same stage folder and manifest.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from epr.context import Context

SCRIPT = Path(__file__).resolve().parents[2] / "training" / "train_epr.py"


def run_encoder(ctx: Context, out: Path, fp: str) -> dict:
    if not SCRIPT.exists():
        raise FileNotFoundError(
            f"{SCRIPT} not found: the encoder stage needs the repository checkout (pip install -e .)"
        )
    cfg_file = out / "resolved_config.yaml"
    out.mkdir(parents=True, exist_ok=True)
    cfg_file.write_text(yaml.safe_dump(_plain(ctx.cfg.to_dict()), sort_keys=True))
    subprocess.run([sys.executable, str(SCRIPT), "-c", str(cfg_file)], check=True)
    import json

    m = json.loads((out / "manifest.json").read_text())
    return {"rows": m["rows"], "extra": {"history": m.get("history")}}


def _plain(x):
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x
