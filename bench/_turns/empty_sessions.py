"""Turns in empty sessions: the three layers, a plain and a tool turn, shuffled per round."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from bench._common import BenchError
from bench._turns.harness import Bench, Request
from bench._turns.timing import Samples, Timing


@dataclass(frozen=True)
class ShortRequests:
    plain: Request
    tool_1: Request  # the tool turn's first call: the model asks for the tool
    tool_2: Request  # its second call: the model answers with the result
    recorded_equal: bool  # the fake's record is what nanobot handed the provider (nulls aside)


async def _capture(b: Bench) -> ShortRequests:
    """One plain and one tool turn; their requests as the fake server received them."""
    _, plain = await b.turn(b.key())
    _, tool = await b.turn(b.key(), tool_call=True)
    bodies = (await b.fake.bodies())[-3:]  # the fake serves this benchmark alone
    if len(plain) != 1 or len(tool) != 2 or len(bodies) != 3:
        raise BenchError(f"expected 1 + 2 model calls, got {len(plain)} + {len(tool)}")
    received = [Request(body["messages"], body.get("tools") or []) for body in bodies]
    equal = all(
        _without_nulls([r.messages, r.tools]) == _without_nulls([n.messages, n.tools])
        for r, n in zip(received, [*plain, *tool], strict=True)
    )
    return ShortRequests(received[0], received[1], received[2], recorded_equal=equal)


def _without_nulls(value: Any) -> Any:
    """`value` without null fields, which litellm leaves out of the request body."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


async def _short_round(
    b: Bench, requests: ShortRequests, rng: random.Random, samples: Samples | None
) -> None:
    """Each item once, in a shuffled order."""

    def add(name: str, timing: Timing) -> None:
        if samples is not None:
            samples.add(name, timing)

    async def bare_plain() -> None:
        add("bare plain", await b.bare(requests.plain))

    async def provider_plain() -> None:
        add("provider plain", await b.provider(requests.plain))

    async def turn_plain() -> None:
        timing, calls = await b.turn(b.key())
        if len(calls) != 1:
            raise BenchError(f"a plain turn made {len(calls)} model calls")
        add("turn plain", timing)

    async def bare_tool() -> None:
        add("bare tool 1", await b.bare(requests.tool_1, tool_call=True))
        add("bare tool 2", await b.bare(requests.tool_2))

    async def provider_tool() -> None:
        add("provider tool 1", await b.provider(requests.tool_1, tool_call=True))
        add("provider tool 2", await b.provider(requests.tool_2))

    async def turn_tool() -> None:
        timing, calls = await b.turn(b.key(), tool_call=True)
        if len(calls) != 2:
            raise BenchError(f"a tool turn made {len(calls)} model calls")
        add("turn tool", timing)

    async def instant_plain() -> None:
        assert b.instant is not None
        add("instant plain", (await b.turn(b.key(), stack=b.instant))[0])

    async def instant_tool() -> None:
        assert b.instant is not None
        add("instant tool", (await b.turn(b.key(), tool_call=True, stack=b.instant))[0])

    items: list[Callable[[], Awaitable[None]]] = [
        bare_plain,
        provider_plain,
        turn_plain,
        bare_tool,
        provider_tool,
        turn_tool,
    ]
    if b.instant is not None:
        items += [instant_plain, instant_tool]
    for prefix, variant in b.variants.items():

        async def variant_plain(prefix: str = prefix, variant: Bench = variant) -> None:
            add(f"{prefix} turn plain", (await variant.turn(variant.key()))[0])

        async def variant_bare(prefix: str = prefix, variant: Bench = variant) -> None:
            add(f"{prefix} bare plain", await variant.bare(requests.plain))

        items += [variant_plain, variant_bare]
    rng.shuffle(items)
    for item in items:
        await item()


async def short_phase(
    b: Bench, warmups: int, rounds: int, rng: random.Random
) -> tuple[Samples, ShortRequests]:
    requests = await _capture(b)
    samples = Samples()
    for index in range(warmups + rounds):
        await _short_round(b, requests, rng, samples if index >= warmups else None)
    return samples, requests
