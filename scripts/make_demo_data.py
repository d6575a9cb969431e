"""Generate the packaged demo set ``epr/data/demo.{pool,eval}.jsonl`` (a smart-home command parser).

Written for this project and released under CC0-1.0. Deterministic: rerun it and the files are identical.
Outputs use an MTOP-like bracket syntax so the demo exercises the same code paths as the real tasks.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

ROOMS = ["kitchen", "living room", "bedroom", "bathroom", "garage", "office", "hallway", "basement"]
TIMES = ["7 am", "6:30 am", "noon", "9 pm", "10:15 pm", "5 pm", "8 am tomorrow", "midnight"]
DAYS = ["today", "tomorrow", "this weekend", "on Monday", "on Friday", "next week"]
CITIES = ["Paris", "Boston", "Tokyo", "Lagos", "Lima", "Oslo", "Denver", "Mumbai"]
ARTISTS = ["Miles Davis", "Adele", "Bach", "Daft Punk", "Nina Simone", "Queen", "Bob Marley", "Bjork"]
GENRES = ["jazz", "rock", "classical music", "reggae", "hip hop", "lo-fi"]
PEOPLE = ["Alice", "Bob", "Mom", "Dad", "Priya", "Kenji", "Olu", "Sara"]
ITEMS = ["milk", "eggs", "batteries", "coffee", "dish soap", "bread", "apples", "rice"]
TASKS = [
    "take out the trash",
    "water the plants",
    "call the dentist",
    "pay rent",
    "feed the cat",
    "pick up the kids",
]
TEMPS = ["68", "70", "72", "65", "75", "20"]


def s(name: str, value: str) -> str:
    return f"[SL:{name} {value} ]"


def make(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(10)
    r, t, d, c = rng.choice(ROOMS), rng.choice(TIMES), rng.choice(DAYS), rng.choice(CITIES)
    if kind == 0:
        x = rng.choice(
            [f"turn on the {r} lights", f"switch on the lights in the {r}", f"lights on in the {r} please"]
        )
        return x, f"[IN:TURN_ON_LIGHT {s('LOCATION', r)} ]"
    if kind == 1:
        x = rng.choice(
            [f"turn off the {r} lights", f"kill the lights in the {r}", f"switch the {r} lights off"]
        )
        return x, f"[IN:TURN_OFF_LIGHT {s('LOCATION', r)} ]"
    if kind == 2:
        x = rng.choice([f"set an alarm for {t}", f"wake me up at {t}", f"alarm at {t} please"])
        return x, f"[IN:CREATE_ALARM {s('DATE_TIME', t)} ]"
    if kind == 3:
        x = rng.choice([f"what's the weather in {c} {d}", f"will it rain in {c} {d}", f"{c} forecast {d}"])
        slots = s("LOCATION", c) + " " + s("DATE_TIME", d)
        return x, f"[IN:GET_WEATHER {slots} ]"
    if kind == 4:
        if rng.random() < 0.5:
            a = rng.choice(ARTISTS)
            x = rng.choice([f"play some {a}", f"put on {a}", f"I want to hear {a}"])
            return x, f"[IN:PLAY_MUSIC {s('MUSIC_ARTIST_NAME', a)} ]"
        g = rng.choice(GENRES)
        x = rng.choice([f"play {g} in the {r}", f"put some {g} on in the {r}"])
        return x, f"[IN:PLAY_MUSIC {s('MUSIC_GENRE', g)} {s('LOCATION', r)} ]"
    if kind == 5:
        p = rng.choice(PEOPLE)
        x = rng.choice([f"call {p}", f"phone {p} now", f"give {p} a ring"])
        return x, f"[IN:CREATE_CALL {s('CONTACT', p)} ]"
    if kind == 6:
        p, msg = (
            rng.choice(PEOPLE),
            rng.choice(["I'm running late", "dinner is ready", "see you soon", "call me back"]),
        )
        x = rng.choice([f"text {p} that {msg}", f"send a message to {p} saying {msg}", f"tell {p} {msg}"])
        return x, f"[IN:SEND_MESSAGE {s('RECIPIENT', p)} {s('CONTENT_EXACT', msg)} ]"
    if kind == 7:
        task = rng.choice(TASKS)
        x = rng.choice(
            [
                f"remind me to {task} {d}",
                f"set a reminder {d} to {task}",
                f"don't let me forget to {task} {d}",
            ]
        )
        return x, f"[IN:CREATE_REMINDER {s('TODO', task)} {s('DATE_TIME', d)} ]"
    if kind == 8:
        v = rng.choice(TEMPS)
        x = rng.choice(
            [f"set the {r} to {v} degrees", f"make it {v} degrees in the {r}", f"{r} thermostat to {v}"]
        )
        return x, f"[IN:SET_TEMPERATURE {s('LOCATION', r)} {s('TEMPERATURE', v)} ]"
    item = rng.choice(ITEMS)
    x = rng.choice([f"add {item} to my shopping list", f"put {item} on the grocery list", f"we need {item}"])
    return x, f"[IN:ADD_TO_LIST {s('ITEM', item)} {s('LIST', 'shopping')} ]"


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
