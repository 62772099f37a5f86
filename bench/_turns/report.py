"""Printing the table, the request sizes, the profiles and the micro-measurements; the JSON."""

from __future__ import annotations

import pstats
import statistics
from collections.abc import Sequence
from typing import Any

from bench._common import Metric, format_table
from bench._turns.measure import Measurements
from bench._turns.profiling import IDLE, attribute, cumulative, nanobot_top
from bench._turns.scenario import (
    COLD_STARTS,
    LOCAL_ROUNDS,
    LOCAL_WARMUP_ROUNDS,
    LONG_ENTRIES,
    LONG_ROUNDS,
    LONG_WARMUPS,
    PROFILE_LONG_CALLS,
    PROFILE_LONG_TURNS,
    PROFILE_TURNS,
    ROUNDS,
    WARMUP_ROUNDS,
)


def _per_turn(seconds: float, turns: int) -> float:
    return seconds / turns * 1000


def _print_profile(title: str, stats: pstats.Stats, turns: int) -> dict[str, Any]:
    totals = attribute(stats)
    whole = sum(totals.values())
    busy = whole - totals.get(IDLE, 0.0)
    print(f"\n{title}: {turns} turns, {_per_turn(whole, turns):.2f} ms per turn under cProfile")
    for owner, seconds in sorted(totals.items(), key=lambda kv: -kv[1]):
        share = "" if owner == IDLE else f"  {seconds / busy:6.1%} of the CPU"
        print(f"  {_per_turn(seconds, turns):7.2f} ms  {owner}{share}")
    top = nanobot_top(stats, 14)
    print("  nanobot functions by cumulative time, per turn (the model call task excluded):")
    for label, seconds in top:
        print(f"  {_per_turn(seconds, turns):7.2f} ms  {label}")
    return {
        "turns": turns,
        "per_turn_ms": {k: _per_turn(v, turns) for k, v in totals.items()},
        "nanobot_top_ms": [(label, _per_turn(v, turns)) for label, v in top],
    }


def report(m: Measurements, metrics: Sequence[Metric]) -> dict[str, Any]:
    info = m.info
    print(format_table(metrics))
    plain = m.short_requests.plain
    messages_long = statistics.median(info.messages_long)
    bytes_long = statistics.median(info.bytes_long)
    slope = (m.long.median("bare long") - m.long.median("bare empty")) / (
        messages_long - info.messages_empty
    )
    transform_s = cumulative(
        m.profile_long_bare, "openai/_utils/_transform.py", "async_maybe_transform"
    )
    transform_ms = _per_turn(transform_s, PROFILE_LONG_CALLS)
    bare_owners = attribute(m.profile_long_bare)
    bare_profiled_ms = _per_turn(
        sum(bare_owners.values()) - bare_owners.get(IDLE, 0.0), PROFILE_LONG_CALLS
    )
    print(
        f"\nRequests: an empty-session turn sends {info.messages_empty} messages "
        f"({info.bytes_empty / 1024:.1f} KiB of messages, {len(plain.tools)} tools); the "
        f"10k-session turn {messages_long:.0f} ({bytes_long / 1024:.0f} KiB). The first turn in "
        f"the pre-filled session sent {info.first_turn_messages} and its compaction "
        f"{info.compaction_messages}; measured turns that compacted: {info.compacting_turns}. "
        f"In the direct transport's own rounds the long session sent "
        f"{statistics.median(info.messages_direct):.0f} messages (median; "
        f"{min(info.messages_direct)}-{max(info.messages_direct)}) and "
        f"{info.compacting_turns_direct} turns compacted."
    )
    print(
        f"The bare litellm call costs {slope:.3f} ms more per extra message. Under cProfile, "
        f"openai's request transform (async_maybe_transform) takes {transform_ms:.1f} ms of "
        f"{bare_profiled_ms:.1f} ms per 10k-session call "
        f"({transform_ms / len(m.long_request.messages) * 1000:.0f} µs per message, profiled)."
    )
    print(
        "Requests as the fake received them = what nanobot gave the provider (null fields "
        f"aside): {m.short_requests.recorded_equal}. "
        f"Pre-fill: {info.prefill_s:.2f} s."
    )
    profiles = {
        "plain": _print_profile("Profile of plain turns", m.profile, PROFILE_TURNS),
        "instant": _print_profile(
            "Profile of plain turns with the instant provider", m.profile_instant, PROFILE_TURNS
        ),
        "long": _print_profile("Profile of 10k-session turns", m.profile_long, PROFILE_LONG_TURNS),
    }
    print("\nnanobot's per-turn operations, priced without the profiler (plain turn):")
    for item in m.micro:
        print(
            f"  {item.us_per_call:8.1f} µs x {item.calls_per_turn:5.1f}/turn = "
            f"{item.ms_per_turn:6.2f} ms  {item.operation}"
        )
    return {
        "metrics": [metric.as_json() for metric in metrics],
        "samples": {
            "empty_sessions_process_fake": m.short.as_json(),
            "empty_sessions_in_process_fake": m.local.as_json(),
            "long_session": m.long.as_json(),
            "long_session_direct_alone": m.direct_long.as_json(),
            "first_turn_after_start_up": m.cold.as_json(),
        },
        "long_session": {
            "entries": LONG_ENTRIES,
            "prefill_s": info.prefill_s,
            "first_turn_ms": info.first_turn_ms,
            "first_turn_model_calls": info.first_turn_calls,
            "first_turn_messages": info.first_turn_messages,
            "compaction_messages": info.compaction_messages,
            "messages_per_request_long": messages_long,
            "message_bytes_long": bytes_long,
            "messages_per_request_empty": info.messages_empty,
            "message_bytes_empty": info.bytes_empty,
            "compacting_turns": info.compacting_turns,
            "messages_per_request_long_direct": statistics.median(info.messages_direct),
            "compacting_turns_direct": info.compacting_turns_direct,
            "bare_ms_per_extra_message": slope,
            "openai_transform_ms_profiled": transform_ms,
            "bare_call_ms_profiled": bare_profiled_ms,
        },
        "recorded_request_equal": m.short_requests.recorded_equal,
        "profiles": profiles,
        "micro": [
            {
                "operation": item.operation,
                "us_per_call": item.us_per_call,
                "calls_per_turn": item.calls_per_turn,
                "ms_per_turn": item.ms_per_turn,
            }
            for item in m.micro
        ],
        "runs": {
            "rounds": {"warmups": WARMUP_ROUNDS, "measured": ROUNDS},
            "in_process_rounds": {"warmups": LOCAL_WARMUP_ROUNDS, "measured": LOCAL_ROUNDS},
            "long_rounds": {"warmups": LONG_WARMUPS, "measured": LONG_ROUNDS},
            "cold_starts": COLD_STARTS,
            "profiled_turns": {"plain": PROFILE_TURNS, "long": PROFILE_LONG_TURNS},
        },
    }
