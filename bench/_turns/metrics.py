"""The table's rows: layers, overheads and ratios from the measured samples."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from bench._common import Metric
from bench._turns.measure import Measurements
from bench._turns.scenario import LONG_TARGET_X, PLAIN_TARGET_MS, ROUTE_MODEL, TOOL_TARGET_MS
from bench._turns.timing import Samples


def _difference(values_a: Sequence[float], values_b: Sequence[float]) -> list[float]:
    return [a - b for a, b in zip(values_a, values_b, strict=True)]


def _short_metrics(s: Samples, prefix: str, *, full: bool) -> list[Metric]:
    """The plain and the tool turn in empty sessions: the layers and the overheads."""
    paired = "median of the per-round differences"
    metrics: list[Metric] = []
    for kind, target, bare, provider in (
        ("plain", PLAIN_TARGET_MS, ["bare plain"], ["provider plain"]),
        (
            "tool",
            TOOL_TARGET_MS,
            ["bare tool 1", "bare tool 2"],
            ["provider tool 1", "provider tool 2"],
        ),
    ):
        turn = f"turn {kind}"
        calls = "" if kind == "plain" else ", both calls"

        def overhead(clock: str, turn: str = turn, bare: list[str] = bare) -> float:
            return s.median(turn, clock) - statistics.median(s.summed(*bare, clock=clock))

        def wrapper(clock: str, bare: list[str] = bare, provider: list[str] = provider) -> float:
            return statistics.median(s.summed(*provider, clock=clock)) - statistics.median(
                s.summed(*bare, clock=clock)
            )

        metrics += [
            Metric(f"{prefix}{kind} turn: (3) AgentLoop.handle", "ms", s.ms(turn)),
            Metric(f"{prefix}{kind}: (1) bare litellm{calls}", "ms", s.summed(*bare)),
        ]
        if full:
            metrics.append(
                Metric(
                    f"{kind}: (0) turn, instant provider (nanobot alone)",
                    "ms",
                    s.ms(f"instant {kind}"),
                )
            )
        if full and kind == "tool":
            metrics += [
                Metric("tool: (1a) bare, call 1 (asks for the tool)", "ms", s.ms(bare[0])),
                Metric("tool: (1b) bare, call 2 (answers)", "ms", s.ms(bare[1])),
            ]
        if full:
            metrics.append(
                Metric(f"{kind}: (2) Provider.complete{calls}", "ms", s.summed(*provider))
            )
        metrics += [
            Metric(
                f"{prefix}{kind}: nanobot overhead (3)-(1)",
                "ms",
                [overhead("wall")],
                target=target,
                note="difference of the medians, wall clock",
            ),
            Metric(
                f"{prefix}{kind}: nanobot overhead (3)-(1), CPU",
                "ms",
                [overhead("cpu")],
                target=target,
                note="difference of the medians, process CPU time",
            ),
        ]
        if full:
            metrics += [
                Metric(
                    f"{kind}: (3)-(1) per round",
                    "ms",
                    _difference(s.ms(turn), s.summed(*bare)),
                    note=paired,
                ),
                Metric(f"{kind}: provider wrapper (2)-(1)", "ms", [wrapper("wall")]),
                Metric(f"{kind}: provider wrapper (2)-(1), CPU", "ms", [wrapper("cpu")]),
            ]
    return metrics


def metrics_of(m: Measurements) -> list[Metric]:
    long, cold = m.long, m.cold

    def overhead(session: str, clock: str) -> float:
        return long.median(f"turn {session}", clock) - long.median(f"bare {session}", clock)

    def ratio(clock: str) -> float:
        return long.median("turn long", clock) / long.median("turn empty", clock)

    def paired(session: str) -> float:
        turns, bares = long.ms(f"turn {session}"), long.ms(f"bare {session}")
        return statistics.median(_difference(turns, bares))

    return [
        *_short_metrics(m.short, "", full=True),
        *_short_metrics(m.local, "in-process fake, ", full=False),
        Metric("empty session: turn", "ms", long.ms("turn empty")),
        Metric("empty session: bare litellm call", "ms", long.ms("bare empty")),
        Metric("10k session: turn", "ms", long.ms("turn long")),
        Metric("10k session: bare litellm call", "ms", long.ms("bare long")),
        Metric("10k session: Provider.complete", "ms", long.ms("provider long")),
        Metric(
            "(a) turn, 10k / empty",
            "x",
            [ratio("wall")],
            target=LONG_TARGET_X,
            note="ratio of the medians, wall clock",
        ),
        Metric(
            "(a) turn, 10k / empty, CPU",
            "x",
            [ratio("cpu")],
            target=LONG_TARGET_X,
            note="ratio of the medians, process CPU time",
        ),
        Metric(
            "(a) per round",
            "x",
            [a / b for a, b in zip(long.ms("turn long"), long.ms("turn empty"), strict=True)],
        ),
        Metric("empty session: overhead (turn - bare)", "ms", [overhead("empty", "wall")]),
        Metric("10k session: overhead (turn - bare)", "ms", [overhead("long", "wall")]),
        Metric(
            "(b) overhead, 10k / empty",
            "x",
            [overhead("long", "wall") / overhead("empty", "wall")],
            target=LONG_TARGET_X,
            note="ratio of the differences of the medians, wall clock",
        ),
        Metric(
            "(b) overhead, 10k / empty, paired",
            "x",
            [paired("long") / paired("empty")],
            note="ratio of the medians of the per-round differences turn - bare, wall clock",
        ),
        Metric("empty session: overhead, CPU", "ms", [overhead("empty", "cpu")]),
        Metric("10k session: overhead, CPU", "ms", [overhead("long", "cpu")]),
        Metric(
            "(b) overhead, 10k / empty, CPU",
            "x",
            [overhead("long", "cpu") / overhead("empty", "cpu")],
            target=LONG_TARGET_X,
            note="ratio of the differences of the medians, process CPU time",
        ),
        Metric("instant provider: empty session turn", "ms", long.ms("instant empty")),
        Metric("instant provider: 10k session turn", "ms", long.ms("instant long")),
        Metric(
            "(b') nanobot alone, 10k / empty",
            "x",
            [long.median("instant long") / long.median("instant empty")],
            target=LONG_TARGET_X,
            note="instant-provider turns, ratio of the medians, wall clock",
        ),
        Metric(
            "(b') nanobot alone, 10k / empty, CPU",
            "x",
            [long.median("instant long", "cpu") / long.median("instant empty", "cpu")],
            target=LONG_TARGET_X,
            note="instant-provider turns, ratio of the medians, process CPU time",
        ),
        *_variant_metrics(m, "route"),
        *_variant_metrics(m, "direct"),
        *_alone_metrics(m.direct_long, "transport auto (direct), own rounds:", "turn", "(a) turn"),
        *_alone_metrics(m.direct_long, "nanobot alone, own rounds:", "instant", "(b')"),
        Metric("first turn after start-up: 10k session", "ms", cold.ms("cold long")),
        Metric("10k session turn, running app (interleaved)", "ms", cold.ms("warm long")),
        Metric("first turn after start-up: empty session", "ms", cold.ms("cold empty")),
        Metric(
            "first turn after start-up: 10k / empty",
            "x",
            [cold.median("cold long") / cold.median("cold empty")],
        ),
        Metric("first turn in the pre-filled session (+compaction)", "ms", [m.info.first_turn_ms]),
    ]


def _alone_metrics(samples: Samples, label: str, prefix: str, ratio: str) -> list[Metric]:
    """The long and the empty session's turn of one stack's own rounds, and their ratio
    (wall clock and CPU time), from the items `{prefix} long` and `{prefix} empty`."""
    long, empty = f"{prefix} long", f"{prefix} empty"
    return [
        Metric(f"{label} empty session: turn", "ms", samples.ms(empty)),
        Metric(f"{label} 10k session: turn", "ms", samples.ms(long)),
        *(
            Metric(
                f"{label} {ratio}, 10k / empty{suffix}",
                "x",
                [samples.median(long, clock) / samples.median(empty, clock)],
                target=LONG_TARGET_X,
                note=f"ratio of the medians, {what}",
            )
            for clock, suffix, what in (
                ("wall", "", "wall clock"),
                ("cpu", ", CPU", "process CPU time"),
            )
        ),
    ]


def _variant_metrics(m: Measurements, prefix: str) -> list[Metric]:
    """The same app reaching the model another way: "route", litellm's own HTTP handler
    (ROUTE_MODEL, no openai SDK); "direct", `agent.transport: auto`, the default, which
    calls this model directly (no litellm at all; its "bare" call is `Provider.complete`
    over the `DirectTransport`)."""
    s, long = m.short, m.long
    if prefix == "route":
        label, bare = ROUTE_MODEL.split("/", maxsplit=1)[0] + "/", "bare litellm"
    else:
        label, bare = "transport auto (direct):", "Provider.complete (DirectTransport)"

    def overhead(session: str) -> float:
        return long.median(f"{prefix} turn {session}") - long.median(f"{prefix} bare {session}")

    return [
        Metric(f"{label} plain turn: (3)", "ms", s.ms(f"{prefix} turn plain")),
        Metric(f"{label} plain: (1) {bare}", "ms", s.ms(f"{prefix} bare plain")),
        Metric(
            f"{label} plain: nanobot overhead (3)-(1)",
            "ms",
            [s.median(f"{prefix} turn plain") - s.median(f"{prefix} bare plain")],
            note="difference of the medians, wall clock",
        ),
        Metric(f"{label} empty session: turn", "ms", long.ms(f"{prefix} turn empty")),
        Metric(f"{label} 10k session: turn", "ms", long.ms(f"{prefix} turn long")),
        Metric(f"{label} 10k session: {bare}", "ms", long.ms(f"{prefix} bare long")),
        Metric(
            f"{label} (a) turn, 10k / empty",
            "x",
            [long.median(f"{prefix} turn long") / long.median(f"{prefix} turn empty")],
            target=LONG_TARGET_X,
            note="ratio of the medians, wall clock",
        ),
        Metric(
            f"{label} (b) overhead, 10k / empty",
            "x",
            [overhead("long") / overhead("empty")],
            target=LONG_TARGET_X,
            note="ratio of the differences of the medians, wall clock",
        ),
    ]
