"""Regenerate the sample inputs of the examples (deterministic: fixed seeds).

    python examples/data/make_data.py

Writes, next to this script:

- purchases.csv        user,amount                      (running_total.py)
- clicks.jsonl         {"user", "ts", "page"}           (sessionization.py)
- shop_events.jsonl    {"user", "ts", "event"}          (event_sequencing.py)
- activity.jsonl       {"user", "page"}                 (active_users.py)
- sensor_readings.csv  sensor,value                     (anomaly_detection.py)
"""

from __future__ import annotations

import csv
import json
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

HERE = Path(__file__).parent
USERS = ["alice", "bob", "carol", "dave"]
T0 = datetime(2024, 5, 1, 9, 0, tzinfo=timezone.utc)


def iso(ts: datetime) -> str:
    return ts.isoformat()


def purchases(rng: random.Random) -> list[dict[str, str]]:
    rows = []
    for _ in range(36):
        cents = rng.randint(199, 12999)
        rows.append({"user": rng.choice(USERS), "amount": f"{cents // 100}.{cents % 100:02d}"})
    return rows


def clicks(rng: random.Random) -> list[dict[str, str]]:
    # Per user: bursts of clicks a few minutes apart, separated by gaps of 31-180 minutes;
    # a few gaps of exactly 30 minutes stay in the same session (the gap must be exceeded).
    events: list[tuple[datetime, str, str]] = []
    pages = ["/", "/search", "/item/1", "/item/2", "/cart", "/help"]
    for user in USERS:
        ts = T0 + timedelta(minutes=rng.randint(0, 20))
        for burst in range(rng.randint(2, 3)):
            for _ in range(rng.randint(2, 4)):
                events.append((ts, user, rng.choice(pages)))
                ts += timedelta(minutes=rng.choice([1, 2, 5, 12, 30]), seconds=rng.randint(0, 59) if burst else 0)
            ts += timedelta(minutes=rng.randint(31, 180))
    events.sort()
    return [{"user": u, "ts": iso(t), "page": p} for t, u, p in events]


def shop_events() -> list[dict[str, str]]:
    # Hand-written funnels (interleaved by time): some convert, some have steps out of order.
    script = {
        "alice": ["view", "add_to_cart", "purchase", "view", "purchase", "view", "add_to_cart", "purchase"],
        "bob": ["add_to_cart", "view", "purchase", "view", "view", "add_to_cart", "add_to_cart", "purchase"],
        "carol": ["purchase", "view", "add_to_cart", "view"],
        "dave": ["view", "purchase", "add_to_cart", "purchase", "view", "add_to_cart", "purchase"],
    }
    events: list[tuple[datetime, str, str]] = []
    for i, (user, steps) in enumerate(script.items()):
        for j, step in enumerate(steps):
            events.append((T0 + timedelta(minutes=3 * j, seconds=17 * i), user, step))
    events.sort()
    return [{"user": u, "ts": iso(t), "event": e} for t, u, e in events]


def activity(rng: random.Random) -> list[dict[str, str]]:
    pages = ["/", "/docs", "/pricing", "/login"]
    return [{"user": rng.choice(USERS + ["erin", "frank"]), "page": rng.choice(pages)} for _ in range(30)]


def sensor_readings(rng: random.Random) -> list[dict[str, str]]:
    base = {"s1": 20.0, "s2": 55.0, "s3": 101.3}
    spread = {"s1": 0.5, "s2": 2.0, "s3": 0.3}
    spikes = {("s1", 15), ("s2", 18), ("s3", 12), ("s3", 19)}
    rows = []
    for i in range(22):
        for sensor in base:
            v = rng.gauss(base[sensor], spread[sensor])
            if (sensor, i) in spikes:
                v = base[sensor] + 12 * spread[sensor] * rng.choice([-1, 1])
            rows.append({"sensor": sensor, "value": f"{v:.2f}"})
    return rows


def write_jsonl(path: Path, rows: list[dict[str, str]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def write_csv(path: Path, rows: list[dict[str, str]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def main() -> None:
    write_csv(HERE / "purchases.csv", purchases(random.Random(1)))
    write_jsonl(HERE / "clicks.jsonl", clicks(random.Random(2)))
    write_jsonl(HERE / "shop_events.jsonl", shop_events())
    write_jsonl(HERE / "activity.jsonl", activity(random.Random(4)))
    write_csv(HERE / "sensor_readings.csv", sensor_readings(random.Random(5)))


if __name__ == "__main__":
    main()
