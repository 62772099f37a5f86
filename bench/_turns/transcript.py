"""A plausible long chat, and a session pre-filled with it."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench._common import BenchError
from bench._turns.scenario import PREFILL_BATCH, SEED
from nanobot.agent.context import time_envelope
from nanobot.providers.base import Message
from nanobot.store import Database, NewEntry, SessionStore

_USER = (
    "Remind me to {task} {when}.",
    "What's the weather in {city} {when}?",
    "Add {item} to my shopping list.",
    "What did we decide about {topic}?",
    "How long is the train from {city} to {city2}?",
    "Move my {event} to {when}.",
    "Did I already pay the {bill} bill?",
    "Write a short note to {person} saying I'll be late.",
    "What was that {thing} you recommended?",
    "Thanks, that's perfect.",
)
_ASSISTANT = (
    "Done. I'll remind you to {task} {when}.",
    "{city} {when}: mostly sunny, {n} to {n2} °C, a light westerly wind.",
    "Added {item}. Your list has {n} items now.",
    "We agreed to {decision}; you wanted to look at it again {when}.",
    "About {n} hours with one change; the first direct train leaves at 07:{m:02d}.",
    "Moved your {event} to {when}, with the reminder 15 minutes before.",
    "Yes, you paid the {bill} bill on the {n}th; the receipt is in your notes.",
    'Draft: "Hi {person}, I\'m running about {n} minutes late, sorry! See you soon."',
    'It was "{title}"; you noted it in your memory file last week.',
    "You're welcome!",
)
_WORDS = {
    "task": ["call the dentist", "renew my passport", "water the plants", "book the flat tour"],
    "when": ["tomorrow at 10", "on Friday", "tonight", "next Monday morning", "this weekend"],
    "city": ["Berlin", "Hamburg", "Munich", "Cologne", "Leipzig"],
    "item": ["milk and eggs", "coffee beans", "two lemons", "dish soap", "oat flakes"],
    "topic": ["the holiday budget", "the new sofa", "the project review", "the gym plan"],
    "event": ["haircut", "team call", "dinner with Ana", "car service"],
    "bill": ["electricity", "internet", "phone", "water"],
    "person": ["Sam", "Ana", "my landlord", "the team"],
    "thing": ["book", "podcast", "ramen place", "hiking trail"],
    "decision": ["spend at most 900 euros", "wait for the sale", "move it to spring"],
    "title": ["The Overstory", "Hidden Brain", "Ramen Yokocho", "Malerweg stage 2"],
}


def _chat(entries: int, seed: int = SEED) -> list[Message]:
    """`entries` messages of a plausible assistant chat: user and assistant in turn."""
    rng = random.Random(seed)
    start = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
    messages: list[Message] = []
    for index in range(entries // 2):
        words: dict[str, Any] = {k: rng.choice(v) for k, v in _WORDS.items()}
        words |= {"city2": rng.choice(_WORDS["city"]), "n": rng.randint(2, 25)}
        words |= {"n2": words["n"] + rng.randint(3, 8), "m": rng.randint(0, 59)}
        which = rng.randrange(len(_USER))
        stamp = time_envelope(start + timedelta(minutes=37 * index))
        messages.append({"role": "user", "content": f"[{stamp}]\n{_USER[which].format(**words)}"})
        messages.append({"role": "assistant", "content": _ASSISTANT[which].format(**words)})
    return messages


async def prefill(path: Path, key: str, entries: int) -> float:
    """Give `key` a live session of `entries` entries, appended in batches; returns seconds."""
    started = time.perf_counter()
    async with await Database.open(path) as db:
        store = SessionStore(db)
        session = await store.live(key)
        messages = _chat(entries)
        for index in range(0, len(messages), PREFILL_BATCH):
            batch = messages[index : index + PREFILL_BATCH]
            await store.append(session, [NewEntry("message", m) for m in batch])
        if await store.count(session) != entries:
            raise BenchError("the pre-filled session has the wrong number of entries")
    return time.perf_counter() - started
