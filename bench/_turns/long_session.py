"""Turns in a 10,000-entry session against empty sessions, and the first turn after start-up."""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from bench._common import BenchError
from bench._turns.harness import Bench, Request
from bench._turns.scenario import (
    COLD_STARTS,
    DIRECT_ROUNDS,
    DIRECT_WARMUPS,
    ECHO_REPLY,
    PAUSE_S,
    SUMMARY,
)
from bench._turns.stack import Stack, open_stack
from bench._turns.timing import Samples, Timing


@dataclass
class LongInfo:
    prefill_s: float = 0.0
    first_turn_ms: float = 0.0
    first_turn_calls: int = 0
    first_turn_messages: int = 0
    compaction_messages: int = 0
    messages_long: list[int] = field(default_factory=list)
    bytes_long: list[int] = field(default_factory=list)
    messages_empty: int = 0
    bytes_empty: int = 0
    compacting_turns: int = 0
    messages_direct: list[int] = field(default_factory=list)
    compacting_turns_direct: int = 0


async def first_long_turn(b: Bench, key: str, info: LongInfo) -> None:
    """The first turn in the pre-filled session: reads a full window, then compacts.

    The compaction's model call gets a short scripted summary (the default echo would stream
    the whole transcript back, word by word).
    """
    await b.fake.script(ECHO_REPLY, {"type": "Text", "content": SUMMARY})
    timing, calls = await b.turn(key)
    if len(calls) != 2:
        raise BenchError(
            f"expected the first turn in a full session to compact (2 model calls), "
            f"got {len(calls)}: the benchmark's assumptions no longer hold"
        )
    info.first_turn_ms = timing.wall * 1000
    info.first_turn_calls = len(calls)
    info.first_turn_messages = len(calls[0].messages)
    info.compaction_messages = len(calls[1].messages)


@dataclass
class _Round:
    """One round's samples, and whether a long-session turn in it compacted."""

    info: LongInfo
    samples: Samples = field(default_factory=Samples)
    compacted: bool = False

    def skip(self) -> None:
        self.compacted = True
        self.info.compacting_turns += 1


async def long_round(
    b: Bench,
    key: str,
    plain: Request,
    rng: random.Random,
    *,
    samples: Samples | None,
    info: LongInfo,
) -> None:
    """A turn in the long session, then the bare and provider calls with its very messages;
    and a turn in an empty session with its bare and provider calls. Shuffled. A round in
    which a long-session turn compacted (not a steady-state turn) is left out whole, so that
    the phase's lists stay aligned by round."""
    this_round = _Round(info)
    add, skip_round = this_round.samples.add, this_round.skip

    async def long_group() -> None:
        timing, calls = await b.turn(key)
        if len(calls) != 1:  # compacted after the turn: not a steady-state turn
            skip_round()
            return
        add("turn long", timing)
        request = calls[0]
        if samples is not None:
            info.messages_long.append(len(request.messages))
            info.bytes_long.append(request.size)
        parts: list[tuple[str, Callable[[], Awaitable[Timing]]]] = [
            ("bare long", lambda: b.bare(request)),
            ("provider long", lambda: b.provider(request)),
        ]
        rng.shuffle(parts)
        for name, part in parts:
            add(name, await part())

    async def empty_group() -> None:
        async def turn() -> Timing:
            timing, calls = await b.turn(b.key())
            if len(calls) != 1:
                raise BenchError(f"a plain turn made {len(calls)} model calls")
            return timing

        parts: list[tuple[str, Callable[[], Awaitable[Timing]]]] = [
            ("turn empty", turn),
            ("bare empty", lambda: b.bare(plain)),
            ("provider empty", lambda: b.provider(plain)),
        ]
        rng.shuffle(parts)
        for name, part in parts:
            add(name, await part())

    async def instant_group() -> None:
        assert b.instant is not None
        parts = [("instant long", key), ("instant empty", b.key())]
        rng.shuffle(parts)
        for name, session in parts:
            timing, calls = await b.turn(session, stack=b.instant)
            if len(calls) != 1:
                skip_round()
                return
            add(name, timing)

    async def variant_group(prefix: str, variant: Bench) -> None:
        order = ["long", "empty"]
        rng.shuffle(order)
        for session in order:
            timing, calls = await variant.turn(key if session == "long" else variant.key())
            if len(calls) != 1:
                skip_round()
                return
            add(f"{prefix} turn {session}", timing)
            add(f"{prefix} bare {session}", await variant.bare(calls[0]))

    groups: list[Callable[[], Awaitable[None]]] = [long_group, empty_group]
    if b.instant is not None:
        groups.append(instant_group)
    for prefix, variant in b.variants.items():
        groups.append(functools.partial(variant_group, prefix, variant))
    rng.shuffle(groups)
    for group in groups:
        await group()
    if samples is not None and not this_round.compacted:
        samples.merge(this_round.samples)


async def alone_phase(
    direct: Bench, instant: Stack, key: str, rng: random.Random, info: LongInfo
) -> Samples:
    """`transport: direct` alone, then nanobot alone (the instant provider) alone: per round
    a turn in the long session and one in a new session, in random order.

    With nothing else in the rounds, a ratio of a few ms against a few ms is not drowned in
    noise: litellm's turns leave garbage and threads behind, and every other stack's turns
    in the long session add entries that the next turn must read and count.
    """
    samples = Samples()
    for prefix, stack in (("turn", direct.stack), ("instant", instant)):
        for index in range(DIRECT_WARMUPS + DIRECT_ROUNDS):
            order = ["long", "empty"]
            rng.shuffle(order)
            for session in order:
                timing, calls = await direct.turn(
                    key if session == "long" else direct.key(), stack=stack
                )
                if len(calls) != 1:  # compacted after the turn: not a steady-state turn
                    info.compacting_turns_direct += 1
                    continue
                if index >= DIRECT_WARMUPS:
                    samples.add(f"{prefix} {session}", timing)
                    if session == "long" and prefix == "turn":
                        info.messages_direct.append(len(calls[0].messages))
                await asyncio.sleep(PAUSE_S)
    return samples


async def cold_starts(b: Bench, key: str, rng: random.Random) -> Samples:
    """The first turn after start-up (fresh `_parts`: cold caches), in the long and in an
    empty session, and a turn of the running app in the long session, interleaved."""
    samples = Samples()
    for _ in range(COLD_STARTS):
        keys = [("cold long", key), ("cold empty", b.key()), ("warm long", key)]
        rng.shuffle(keys)
        for name, session in keys:
            if name == "warm long":  # the running app, for comparison
                timing, calls = await b.turn(session)
            else:
                async with open_stack(b.stack.config) as fresh:
                    timing, calls = await b.turn(session, stack=fresh)
            if len(calls) != 1:
                raise BenchError(f"a turn in the start-up comparison made {len(calls)} calls")
            samples.add(name, timing)
    return samples
