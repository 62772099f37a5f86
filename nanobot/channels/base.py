"""The channel port: what a chat platform adapter is, and what it is given.

A channel knows its platform and its own config section, and nothing of the agent. It turns
platform events into `InboundMessage`s and hands them to its `IntakePort` (which checks access,
journals and queues them), having asked it first whether the sender is admitted at all before
downloading anything; it delivers `Outbound` traffic the manager gives it.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import stat
import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Final, Protocol, runtime_checkable

from loguru import logger

from nanobot.bus.events import InboundMessage, Outbound, OutboundMessage
from nanobot.errors import ConfigError
from nanobot.people import People
from nanobot.workspace import ConfinementError, Workspace


class Intake(Enum):
    """What became of a message handed to `intake`."""

    ACCEPTED = "accepted"  # journaled and queued for the agent
    DUPLICATE = "duplicate"  # seen before (a redelivery); nothing to do
    REFUSED = "refused"  # not allowed; nothing was sent to the sender
    PAIRING = "pairing"  # an unknown user in a private chat; a pairing code was sent
    # The gateway is stopping and the sender has no access (no pairing codes while stopping):
    # not taken; do not acknowledge it. Allowed senders' messages are ACCEPTED even then.
    CLOSED = "closed"


class IntakePort(Protocol):
    """Where a channel hands what it receives (the gate)."""

    async def admits(self, channel: str, sender_id: str, *, private: bool, addressed: bool) -> bool:
        """Whether a message from `sender_id` in such a chat would be taken: the sender is
        allowed (allow list, "*" or an approved pairing) and, in a group, the channel's group
        policy lets the message through. Asked before anything of the message is downloaded;
        it changes nothing (no pairing code, no journal row). The answer can be out of date
        by the time the message is handed over (an approval in between): `__call__` decides.

        Raises:
            StoreError: the approvals could not be read (the channel fails the message, as
                when `__call__` fails).
        """

    async def __call__(self, message: InboundMessage) -> Intake:
        """Decide on `message` and, if it is taken, journal and queue it before returning.

        Raises:
            IntakePaused: a store failure stopped intake (this message's journal write, or
                an earlier write); the message was not taken: do not acknowledge it, hand it
                over again later (`_pause.Pause` does).
        """


@runtime_checkable
class IntakeHistory(Protocol):
    """An intake that can say what it took (the gate does). A channel whose platform never
    delivers a message again (Discord) asks it on start, and fetches what came after."""

    async def last_seen(self, channel: str) -> dict[str, str]:
        """Per chat of `channel` with messages taken in the last days, the newest platform
        message id taken: chat id → message id.

        Raises:
            StoreError: the journal could not be read.
        """
        ...

    async def caught_up_until(self, channel: str) -> datetime | None:
        """The moment before which `channel` had everything its platform sent, as it last
        recorded it (`caught_up`), but no earlier than the days `last_seen` covers; None if
        it never recorded one (its first start).

        Raises:
            StoreError: the journal could not be read.
        """
        ...

    async def caught_up(self, channel: str, moment: datetime) -> None:
        """Record that `channel` has had everything its platform sent before `moment`
        (taken, or seen and refused). A moment earlier than the one kept changes nothing.

        Raises:
            StoreError: the journal could not be written.
        """
        ...


def not_fetched(name: str) -> str:
    """The line for a file that was not downloaded because its sender was not admitted (shown
    only if the gate takes the message after all: the owner approved them meanwhile)."""
    return f"I did not take {name}: it came before you were approved; please send it again."


class OutboxPort(Protocol):
    """The outbox as delivery sees it: where each reply stands until its platform has it.

    A reply (an `OutboundMessage` with an `outbox_id`) is sent again after a restart until it
    is confirmed or given up, from the part after the last one recorded; a reply shown while
    it is written (a stream) keeps its platform message here, so after a crash mid-stream its
    final text replaces that message instead of following it. Every method may raise (storage
    trouble): callers log it and go on, and at worst a part is sent again, a final text comes
    as a new message, or a reply the platform refused is tried once more after a restart.
    """

    async def progress(self, outbox_id: int, parts: int) -> None:
        """The first `parts` parts of a long reply are on the platform."""
        ...

    async def confirm(self, outbox_id: int, sent_id: str | None = None) -> None:
        """The whole reply is on the platform (as message `sent_id`, when the channel says
        which); it is never sent again."""
        ...

    async def sent_id(self, outbox_id: int) -> str | None:
        """The platform id of the message that delivered `outbox_id`, if known (what an
        edit of it replaces)."""
        ...

    async def fail(self, outbox_id: int, error: str) -> None:
        """A delivery attempt failed; the reply stays for a later attempt."""
        ...

    async def give_up(self, outbox_id: int, reason: str) -> None:
        """The platform refused the reply for good (`Undeliverable`): it is marked failed
        with `reason` and never sent again."""
        ...

    async def open_streams(self) -> dict[str, int]:
        """Streams whose message is out and whose final text is not: stream id → message id."""
        ...

    async def stream_started(self, stream_id: str, message_id: int) -> None:
        """Message `message_id` now shows stream `stream_id`."""
        ...

    async def stream_finished(self, stream_id: str) -> None:
        """Stream `stream_id`'s final text is out: forget its message."""
        ...


class Voices(Protocol):
    """Where the spoken form of a reply comes from (`OutboundMessage.speak`)."""

    async def voice(self, message: OutboundMessage) -> Path | None:
        """The audio file (OGG/Opus, or MP3) of `message`'s text read aloud, made now or
        found made before; None when nothing of it can be spoken or it could not be made
        (the text then goes alone). Never raises for the speech service or the file;
        cancellable (nothing half-made is kept)."""
        ...


class Role(Protocol):
    """Whether this process takes a channel's messages in. In a cluster (several gateways on
    one store) one member at a time holds a channel's intake (its polling loop, its gateway
    connection) while every member delivers; a gateway on its own always holds it (`SOLO`)."""

    async def hold(
        self, work: Callable[[], Awaitable[None]], *, standby: Callable[[], None] | None = None
    ) -> None:
        """Run `work()` while this process holds the role, each time it comes to hold it,
        until `work` returns or raises (that is returned or raised). When the role is lost,
        `work` is cancelled at once and `hold` waits to hold it again. `standby()` is called
        when another member is found holding it. Cancelling `hold` cancels `work`."""
        ...


class _Solo:
    """The role of the only gateway: always held."""

    async def hold(
        self, work: Callable[[], Awaitable[None]], *, standby: Callable[[], None] | None = None
    ) -> None:
        await work()


SOLO: Final[Role] = _Solo()


class ChannelUnreachable(Exception):
    """The platform could not be reached: no network (a laptop, a boot before the network
    is up), its name not resolved, the connection refused or timed out, or its servers
    failing. The manager starts the channel again with growing pauses, one warning line a
    try, without a traceback (the message says what failed and where)."""


class ChannelRefused(ConfigError):
    """The platform refused the channel itself (its token was rejected, a permission the bot
    needs is not granted): running it again would be refused again, so the manager stops it
    for good with this one line (the reason and what to change) instead of restarting it."""


class DeliveryError(Exception):
    """A message could not be delivered after the channel's own retries, for a reason that
    may pass (the network, the platform's servers, its rate limit): it is tried again later,
    and after a restart."""


class Undeliverable(DeliveryError):
    """The platform refused the message and would refuse it again, in every form the channel
    could give it (plain text, shorter parts): it is given up at once, never retried.

    `chat_closed`: the chat takes nothing from the bot any more (the user blocked it, the
    chat is gone, the bot was removed): nothing more is sent there until the chat writes
    again.
    """

    def __init__(self, reason: str, *, chat_closed: bool = False) -> None:
        super().__init__(reason)
        self.chat_closed = chat_closed


@dataclass(frozen=True, slots=True)
class InboxPolicy:
    """Where received files go, and how large they may be.

    `workspace` is the folder `directory` lies in and that files are confined to (default:
    `directory`'s parent): see `save_file`. A channel saves a sender's files in
    `of(channel, sender)`'s inbox.
    """

    directory: Path
    max_bytes: int = 20 * 1024 * 1024
    workspace: Path | None = None
    people: People | None = None  # with people kept apart, each sender's files go to theirs

    def of(self, channel: str, sender_id: str) -> InboxPolicy:
        """Where the files `sender_id` of `channel` sends go: their own folder's `inbox/`
        when people are kept apart (`nanobot.people`), else this inbox."""
        people = self.people
        if people is None or not people.apart:
            return self
        root = people.root(people.person(channel, sender_id))
        return InboxPolicy(root / self.directory.name, self.max_bytes, people.workspace)


class Channel(ABC):
    """A chat platform adapter.

    Lifecycle: the manager calls `run()` in a task it owns; `run()` connects, calls
    `ready()` once connected, and keeps going until cancelled (then it disconnects cleanly)
    or until the connection fails for good (then it raises; the manager restarts it with
    backoff, unless it raised `ChannelRefused`). `deliver()` may be called whenever `run()`
    is running.
    """

    name: str

    def __init__(self, intake: IntakePort) -> None:
        self.intake = intake

    @abstractmethod
    async def run(self, ready: Callable[[], None]) -> None:
        """Connect and serve until cancelled."""

    @abstractmethod
    async def deliver(self, item: Outbound) -> str | None:
        """Deliver one outbound item; the platform id of the message it posted or edited,
        where there is one and it matters (a card, which may be edited later).

        A message with `replaces` edits that message (its text, and its buttons, which an
        empty `buttons` removes) instead of posting a new one. A message of kind `answer`
        answers the button press `reply_to`, to the one who pressed only.

        Raises:
            DeliveryError: a message could not be delivered after retries; `Undeliverable`
                when the platform refused it for good (best-effort items such as stream
                updates and typing never raise).
        """


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_filename(name: str | None, fallback: str) -> str:
    """A file name that cannot escape its folder or surprise a shell: ASCII letters, digits,
    dots, dashes and underscores, no leading dot, at most 100 characters."""
    text = unicodedata.normalize("NFKD", name or "").encode("ascii", "ignore").decode()
    text = _UNSAFE.sub("_", text.replace("/", "_").replace("\\", "_")).strip("._")
    return (text or fallback)[:100]


class InboxError(OSError):
    """A received file could not be kept. `reason` says why, in words for its sender
    ("the inbox folder has a symbolic link on its way …"; "saving it failed (no space left
    on device)")."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(reason)
        self.name = name
        self.reason = reason

    def line(self) -> str:
        """What the sender is told."""
        return f"I could not keep {self.name}: {self.reason}. Please send it again later."


MOVED_ASIDE = ".not-a-folder"  # what is found in the inbox's place is renamed `inbox.not-a-folder`
MAX_ASIDE = 100  # names tried for it: `inbox.not-a-folder`, then `-1` … `-99`


async def save_file(policy: InboxPolicy, name: str, data: bytes) -> Path:
    """Write a received file as a new file in the inbox, off the event loop; returns its path.

    The file gets `name`, or `name` with a counter added when that is taken; it never
    replaces or writes through anything already there. No symlink is followed on the way
    from the workspace to the file (see `Workspace.create`). Whatever stands where the inbox
    folder should be and is not a folder (a file, a symlink: a command or a file tool may
    leave one) is first moved aside, in the folder it is in, to `inbox.not-a-folder` (or
    `inbox.not-a-folder-1`, …), never followed nor deleted, and a new inbox is made; the move
    is logged.

    Raises:
        InboxError: the file could not be kept (a symlink on the way to the inbox, a full
            disk, …); nothing of it is left behind.
    """
    workspace = Workspace(policy.workspace or policy.directory.parent)

    def write() -> Path:
        _put_right(workspace, policy.directory)
        return policy.directory / workspace.create(policy.directory, name, data)

    try:
        return await asyncio.to_thread(write)
    except ConfinementError as exc:
        raise InboxError(name, f"the inbox folder {exc.reason}") from exc
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise InboxError(name, f"saving it failed ({reason.lower()})") from exc


def _put_right(workspace: Workspace, inbox: Path) -> None:
    """Move whatever is in the place of the `inbox` folder and is not a folder aside."""
    parent = workspace.open_dir(inbox.parent, create=True, follow=False)
    try:
        try:
            info = os.stat(inbox.name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(info.st_mode):
            return
        what = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "a file"
        for counter in range(MAX_ASIDE):
            aside = f"{inbox.name}{MOVED_ASIDE}" + (f"-{counter}" if counter else "")
            # A link never replaces what is there (a rename would); a symlink is linked as
            # itself, not followed.
            try:
                os.link(
                    inbox.name, aside, src_dir_fd=parent, dst_dir_fd=parent, follow_symlinks=False
                )
            except FileExistsError:
                continue
            os.unlink(inbox.name, dir_fd=parent)
            logger.warning(
                "The inbox {} was {}, not a folder: moved it aside to {} and made the folder "
                "again for received files",
                inbox,
                what,
                inbox.with_name(aside),
            )
            return
        raise FileExistsError(errno.EEXIST, "no free name to move it aside to", str(inbox))
    finally:
        os.close(parent)


async def read_outgoing(policy: InboxPolicy, path: Path) -> bytes:
    """The bytes of a file under the workspace that goes out to a chat (a reply's voice
    note), read off the event loop and confined to the workspace like received files: no
    symlink the model may have left there leads it elsewhere.

    Raises:
        OSError: it cannot be read (`ConfinementError` for one that leads outside).
    """
    workspace = Workspace(policy.workspace or policy.directory.parent)
    return await asyncio.to_thread(workspace.read_bytes, path)


def discard_files(paths: Iterable[Path]) -> None:
    """Delete received files nobody will read: their message was not taken, or not read to
    the end. Blocking but brief: through `asyncio.to_thread` on the way of a message, called
    directly on an error path."""
    for path in paths:
        path.unlink(missing_ok=True)
