"""An outbox in memory: the `OutboxPort` channels and the manager are given, recording what
they tell it, for tests that need no database (the real one is the store's `Journal`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class MemoryOutbox:
    """Implements `nanobot.channels.base.OutboxPort`.

    `streams` is what a restart would find open (give it to a second channel to play the
    restart); `progressed`, `confirmed`, `failed` and `given_up` list the calls in order;
    `sent` maps a confirmed row to the message id its channel named.
    """

    streams: dict[str, int] = field(default_factory=dict)
    progressed: list[tuple[int, int]] = field(default_factory=list)
    confirmed: list[int] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)
    given_up: list[tuple[int, str]] = field(default_factory=list)
    sent: dict[int, str] = field(default_factory=dict)

    async def progress(self, outbox_id: int, parts: int) -> None:
        self.progressed.append((outbox_id, parts))

    async def confirm(self, outbox_id: int, sent_id: str | None = None) -> None:
        self.confirmed.append(outbox_id)
        if sent_id is not None:
            self.sent[outbox_id] = sent_id

    async def sent_id(self, outbox_id: int) -> str | None:
        return self.sent.get(outbox_id)

    async def fail(self, outbox_id: int, error: str) -> None:
        self.failed.append((outbox_id, error))

    async def give_up(self, outbox_id: int, reason: str) -> None:
        self.given_up.append((outbox_id, reason))

    async def open_streams(self) -> dict[str, int]:
        return dict(self.streams)

    async def stream_started(self, stream_id: str, message_id: int) -> None:
        self.streams[stream_id] = message_id

    async def stream_finished(self, stream_id: str) -> None:
        self.streams.pop(stream_id, None)
