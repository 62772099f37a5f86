"""What ``bench/cluster.py`` measures in each phase, and the figures it reports from that:
each with its target where issue 17 sets one."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from bench import gateway_throughput as g
from bench._cluster import LEASE_S
from bench._cluster_failover import Failover
from bench._common import Metric
from bench._setup import Burst

BURST_TARGET_X = 1.5  # PostgreSQL / SQLite, one gateway, all of a burst answered
FAILOVER_TARGET_S = LEASE_S + 1.0  # kill -9 of a session's holder -> the chat's answer


@dataclass(frozen=True)
class Flood:
    members: int
    chats: int
    last_s: float  # until the last chat showed its answer
    p10_s: float
    p50_s: float
    p90_s: float
    acked_s: float | None  # until the last webhook post was acknowledged
    refused_posts: int
    api_calls: dict[str, int]
    cpu_s: dict[str, float]  # each member, the fake Telegram, the model, PostgreSQL
    held: list[int] = field(default_factory=list)  # sessions each member holds, most first

    @property
    def rate(self) -> float:
        return self.chats / self.last_s

    @property
    def steady_rate(self) -> float:
        """Answers per second between the 10th and 90th percentile chat."""
        return 0.8 * self.chats / (self.p90_s - self.p10_s)


@dataclass
class Measurements:
    flood_chats: int
    trials: int
    bursts: dict[str, list[Burst]] = field(default_factory=dict)
    postgres_cpu_s: dict[str, list[float]] = field(default_factory=dict)
    floods: dict[int, list[Flood]] = field(default_factory=dict)
    failovers: list[Failover] = field(default_factory=list)
    load: dict[str, list[float]] = field(default_factory=dict)


def metrics_of(m: Measurements) -> list[Metric]:
    med = statistics.median
    out: list[Metric] = []
    if m.bursts:
        sqlite, pg = m.bursts["sqlite"], m.bursts["postgresql"]
        out.append(
            Metric(
                f"{g.BIG_CHATS} chats, one gateway: PostgreSQL / SQLite, all answered",
                "x",
                [p.wall / s.wall for p, s in zip(pg, sqlite, strict=True)],
                target=BURST_TARGET_X,
                note="per round",
            )
        )
        for name, bursts in (("SQLite", sqlite), ("PostgreSQL", pg)):
            label = f"{g.BIG_CHATS} chats, {name}"
            out += [
                Metric(f"{label}: all answered", "s", [b.wall for b in bursts]),
                Metric(f"{label}: median chat", "s", [med(b.final_s) for b in bursts]),
                Metric(f"{label}: all taken (acked)", "s", [b.taken_s or 0.0 for b in bursts]),
                Metric(f"{label}: gateway CPU", "s", [b.cpu_s["gateway"] for b in bursts]),
            ]
        out.append(
            Metric(
                f"{g.BIG_CHATS} chats, PostgreSQL: server CPU",
                "s",
                m.postgres_cpu_s["postgresql"],
            )
        )
    one = m.floods.get(1, [])
    for n, floods in sorted(m.floods.items()):
        label = f"{m.flood_chats} chats, {n} member{'s' if n > 1 else ''}"
        out += [
            Metric(f"{label}: answers per second", "msg/s", [f.rate for f in floods]),
            Metric(f"{label}: all answered", "s", [f.last_s for f in floods]),
            Metric(f"{label}: p10-p90 rate", "msg/s", [f.steady_rate for f in floods]),
            Metric(f"{label}: webhook posts acked", "s", [f.acked_s or 0.0 for f in floods]),
            Metric(
                f"{label}: members' CPU",
                "s",
                [sum(v for k, v in f.cpu_s.items() if k.startswith("member")) for f in floods],
            ),
            Metric(f"{label}: PostgreSQL CPU", "s", [f.cpu_s["postgresql"] for f in floods]),
            Metric(f"{label}: fake Telegram CPU", "s", [f.cpu_s["telegram"] for f in floods]),
        ]
        if n > 1 and len(one) == len(floods):
            out.append(
                Metric(
                    f"{label}: rate / 1 member",
                    "x",
                    [f.rate / o.rate for f, o in zip(floods, one, strict=True)],
                    note="per round",
                )
            )
    if m.failovers:
        killed = [f.killed_s for f in m.failovers]
        out += [
            Metric("failover: kill -9 -> answer", "s", killed, target=FAILOVER_TARGET_S),
            Metric("failover: worst of the trials", "s", [max(killed)], target=FAILOVER_TARGET_S),
            Metric("failover: kill -9 -> lease ran out", "s", [f.lapse_s for f in m.failovers]),
            Metric(
                "failover: lease ran out -> answer",
                "s",
                [f.killed_s - f.lapse_s for f in m.failovers],
            ),
        ]
    return out
