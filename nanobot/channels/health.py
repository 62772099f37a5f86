"""Each channel's state as the running gateway sees it: connected since when, or down since
when and why. `nanobot status` shows it, and `status --check` fails while an enabled channel
has been down too long (`gateway.channel_down_limit`).

The gateway keeps the states in `channels.json` in its data dir, written anew (a whole file
put in place by a rename) at each change: another process reads them without a database,
and a reader never sees half a file. The reasons pass the redactor it is given, the log's
(a library's error may quote a URL with the bot token in it). A write that fails (a full
disk) is said once and changes nothing else: the channels run on, and the next change
writes again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Final

from loguru import logger

FILE: Final = "channels.json"
"""The file in the data dir that holds the running gateway's channel states."""

_MAX_REASON: Final = 300  # characters of a failure's text kept: one line in `status`


@dataclass(frozen=True, slots=True)
class ChannelState:
    """One channel: up (connected) or not, since when, and why it is down ("" while it
    starts). `for_good`: the platform refused it, and it is not started again."""

    name: str
    up: bool
    since: datetime
    reason: str = ""
    for_good: bool = False

    def down_for(self, now: datetime) -> timedelta:
        """How long it has been down at `now` (zero while it is up)."""
        return timedelta(0) if self.up else max(timedelta(0), now - self.since)

    def describe(self, moment: Callable[[datetime], str]) -> str:
        """Its state for a person, times written by `moment`."""
        if self.up:
            return f"connected since {moment(self.since)}"
        if not self.reason:
            return f"connecting since {moment(self.since)}"
        stopped = "stopped for good" if self.for_good else "down"
        return f"{stopped} since {moment(self.since)}: {self.reason}"


class ChannelHealth:
    """The channels' states, kept in `path` (None: in memory only) as they change, each
    reason passed through `redact` first. Each starts down, connecting, at the moment it is
    made."""

    def __init__(
        self,
        names: Iterable[str],
        path: Path | None,
        clock: Callable[[], datetime],
        redact: Callable[[str], str] = str,
    ) -> None:
        self._path = path
        self._clock = clock
        self._redact = redact
        now = clock()
        self._states = {name: ChannelState(name, up=False, since=now) for name in names}
        self._unwritable = False
        self._write()

    def states(self) -> list[ChannelState]:
        """Every channel's state, in the order they were named."""
        return list(self._states.values())

    def connected(self, name: str) -> None:
        """`name` is connected: up since now (unless it was up already)."""
        if not self._states[name].up:
            self._set(ChannelState(name, up=True, since=self._clock()))

    def failed(self, name: str, reason: str, *, for_good: bool = False) -> None:
        """`name` stopped or could not connect: down since now if it was up, else since it
        went down; the reason is the latest failure's."""
        state = self._states[name]
        reason = _line(self._redact(reason))
        if state.up:
            self._set(ChannelState(name, up=False, since=self._clock(), reason=reason))
        else:
            self._set(replace(state, reason=reason, for_good=for_good))

    def _set(self, state: ChannelState) -> None:
        self._states[state.name] = state
        self._write()

    def _write(self) -> None:
        if self._path is None:
            return
        text = json.dumps([_record(s) for s in self._states.values()], indent=1)
        temporary = self._path.with_name(f".{self._path.name}.{os.getpid()}")
        try:
            temporary.write_text(text + "\n", encoding="utf-8")
            temporary.replace(self._path)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            if not self._unwritable:
                logger.warning(
                    "could not record the channels' states in {} ({}): `nanobot status` shows "
                    "them out of date until a write succeeds",
                    self._path,
                    exc,
                )
            self._unwritable = True
        else:
            if self._unwritable:
                logger.info("the channels' states are recorded again in {}", self._path)
            self._unwritable = False


def read_states(path: Path) -> list[ChannelState] | None:
    """The states a gateway recorded in `path`; None when it holds none (no gateway wrote
    one yet). A file that cannot be parsed reads as none too: it is rewritten at the next
    change, and `status` must not fail for it."""
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
        return [_state(record) for record in records]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        logger.debug("unreadable channel states in {}: {}", path, exc)
        return None


def _line(text: str) -> str:
    """`text` on one line, cut to what `status` shows."""
    flat = " ".join(text.split())
    return flat if len(flat) <= _MAX_REASON else flat[: _MAX_REASON - 1] + "…"


def _record(state: ChannelState) -> dict[str, object]:
    return {
        "name": state.name,
        "up": state.up,
        "since": state.since.isoformat(),
        "reason": state.reason,
        "for_good": state.for_good,
    }


def _state(record: dict[str, object]) -> ChannelState:
    return ChannelState(
        name=str(record["name"]),
        up=bool(record["up"]),
        since=datetime.fromisoformat(str(record["since"])),
        reason=str(record.get("reason", "")),
        for_good=bool(record.get("for_good", False)),
    )
