"""Generate the packaged demo set ``epr/data/demo.{pool,eval}.jsonl`` (a smart-home command parser).

Written for this project and released under CC0-1.0. Deterministic: rerun it and the files are identical.
Outputs use an MTOP-like bracket syntax so the demo exercises the same code paths as the real tasks.

The set is built so that retrieval matters (issue 78; epr/data/README.md says how and what was measured): eleven
intents share their words ("turn on" the lights, a device, an alarm or some music; "turn off" the lights, a
device, the music or an alarm; every room in seven of them), while one intent's paraphrases share few ("kill the
garage lights", "make the garage dark"). BM25 over the inputs then often ranks a demonstration of another intent
first; a retriever trained on the LM's labels learns which demonstrations the LM copies the right parse from.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

ROOMS = ["kitchen", "living room", "bedroom", "bathroom", "garage", "office", "hallway", "basement"]
DEVICES = ["fan", "tv", "heater", "speaker", "coffee maker", "dishwasher"]
GENRES = ["jazz", "rock", "classical music", "reggae", "hip hop", "lo-fi"]
TIMES = ["7 am", "6:30 am", "noon", "9 pm", "10:15 pm", "5 pm", "8 am tomorrow", "midnight"]
TEMPS = ["68", "70", "72", "65", "75", "20"]
TASKS = [
    "take out the trash",
    "water the plants",
    "call the dentist",
    "pay rent",
    "feed the cat",
    "lock the door",
]


def s(name, value):
    return f"[SL:{name} {value} ]"


def make(rng):
    r, d, g, t, v, task = (
        rng.choice(ROOMS),
        rng.choice(DEVICES),
        rng.choice(GENRES),
        rng.choice(TIMES),
        rng.choice(TEMPS),
        rng.choice(TASKS),
    )
    loc = s("LOCATION", r)
    kinds = [
        (
            [
                f"turn on the {r} lights",
                f"lights on in the {r}",
                f"brighten up the {r}",
                f"I can't see anything in the {r}",
            ],
            f"[IN:TURN_ON_LIGHT {loc} ]",
        ),
        (
            [
                f"turn off the {r} lights",
                f"lights off in the {r}",
                f"make the {r} dark",
                f"kill the {r} lights",
            ],
            f"[IN:TURN_OFF_LIGHT {loc} ]",
        ),
        (
            [f"dim the {r} lights", f"turn the {r} lights down", f"the {r} is too bright"],
            f"[IN:DIM_LIGHT {loc} ]",
        ),
        (
            [f"set the {r} to {v} degrees", f"turn the heat in the {r} to {v}", f"I want the {r} at {v}"],
            f"[IN:SET_TEMPERATURE {loc} {s('TEMPERATURE', v)} ]",
        ),
        (
            [f"turn on the {d} in the {r}", f"switch the {r} {d} on", f"start the {d} in the {r}"],
            f"[IN:TURN_ON_DEVICE {s('DEVICE', d)} {loc} ]",
        ),
        (
            [f"turn off the {d} in the {r}", f"switch the {r} {d} off", f"stop the {d} in the {r}"],
            f"[IN:TURN_OFF_DEVICE {s('DEVICE', d)} {loc} ]",
        ),
        (
            [f"play {g} in the {r}", f"turn on some {g} in the {r}", f"I feel like {g} in the {r}"],
            f"[IN:PLAY_MUSIC {s('MUSIC_GENRE', g)} {loc} ]",
        ),
        (
            [f"stop the music in the {r}", f"turn the music off in the {r}", f"quiet in the {r} please"],
            f"[IN:STOP_MUSIC {loc} ]",
        ),
        (
            [f"set an alarm for {t}", f"wake me up at {t}", f"turn on an alarm for {t}"],
            f"[IN:CREATE_ALARM {s('DATE_TIME', t)} ]",
        ),
        (
            [f"cancel my {t} alarm", f"turn off the alarm for {t}", f"no alarm at {t} after all"],
            f"[IN:DELETE_ALARM {s('DATE_TIME', t)} ]",
        ),
        (
            [
                f"remind me to {task} at {t}",
                f"at {t} tell me to {task}",
                f"don't let me forget to {task} at {t}",
            ],
            f"[IN:CREATE_REMINDER {s('TODO', task)} {s('DATE_TIME', t)} ]",
        ),
    ]
    xs, y = rng.choice(kinds)
    return rng.choice(xs), y


def main() -> None:
    rng = random.Random(2026)
    seen: dict[str, str] = {}
    while len(seen) < 400:
        x, y = make(rng)
        seen.setdefault(x, y)
    rows = [{"id": f"demo-{i:03d}", "input": x, "output": y} for i, (x, y) in enumerate(seen.items())]
    out = Path(__file__).resolve().parent.parent / "epr" / "data"
    for name, part in (("pool", rows[:320]), ("eval", rows[320:])):
        with open(out / f"demo.{name}.jsonl", "w", encoding="utf-8") as f:
            for r in part:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
