"""Catching up on Discord: taking what was sent while nanobot was not connected.

Discord delivers each message once, over the gateway connection. What is sent while nanobot
is stopped, or between two gateway sessions (a RESUME replays what was missed; a new session
does not), is only in the chats' history. So at the start of each session the history is
fetched, in each chat's lane, and taken like a message that has just arrived (the gate
ignores what it took before):

- a chat with messages taken in the last days (`IntakeHistory.last_seen`): what came after
  the newest one taken (or after the moment below, if that is later);
- a chat nanobot can find without having taken anything there lately: the DM of each user
  in `allow_from` (opened for this), and, unless `group_policy` is `disabled`, each guild
  text channel or active thread the bot may read whose last message is newer: what came
  after the moment the channel last had everything (`IntakeHistory.caught_up_until`, at
  most the last days back), less `CLOCK_MARGIN` for clocks that disagree. At the very
  first start there is no such moment, and these are not fetched. At most `MAX_CHATS`
  users' DMs, and `MAX_CHATS` channels, those with the newest messages.

The chats known and the channels are queued at once at the start of the first session, so
before any message that arrives from then on; a DM only once opened, and after a new
session everything once the journal has said which chats are known: a message arriving
in between is taken first, and the older ones after it (each still once).

At most `LIMIT` messages per chat, oldest first. The moment is recorded (`caught_up`) when
a session's catch-up has taken everything it fetched (then it is the session's start), and
when the channel stops with nothing left untaken while connected and caught up (then it is
the stop). After a `kill -9` the next start reaches back to the start of the last session
whose catch-up finished: messages seen then are fetched again, and refused again or
recognised as taken.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Final

import aiohttp
import discord
from discord.utils import time_snowflake
from loguru import logger

from nanobot.channels import _discord_inbound as inbound
from nanobot.channels.base import IntakeHistory
from nanobot.errors import StoreError
from nanobot.lanes import Closed, Lanes
from nanobot.tasks import TaskSet

CHANNEL: Final = inbound.CHANNEL
LIMIT: Final = 100  # messages fetched per chat
MAX_CHATS: Final = 50  # allowed users' DMs, and server channels, read beyond those known
CLOCK_MARGIN: Final = timedelta(minutes=5)  # this host's clock against Discord's

Take = Callable[[discord.Client, discord.Message], Awaitable[bool]]
"""Hand one message to intake as if it had just arrived; whether it was taken (or refused)
rather than lost to an error. Never raises."""

_FAILURES = (discord.DiscordException, aiohttp.ClientError, OSError, TimeoutError)


class CatchUp:
    """The catch-up of one run of the channel: `load` before connecting, `ready` at each
    new gateway session, `dropped` and `resumed` as the connection goes and comes back,
    `close` then `stopped` when the channel stops. See the module docstring."""

    def __init__(
        self,
        history: IntakeHistory | None,
        *,
        allow_from: Sequence[str],
        guilds: bool,
        take: Take,
    ) -> None:
        """`history`: None when intake keeps none (nothing is fetched). `guilds`: whether
        guild channels are looked at for messages (not when groups are ignored)."""
        self._history = history
        self._users = [int(user) for user in allow_from if user.isdigit()]
        self._guilds = guilds
        self._take = take
        self._tasks = TaskSet("discord-catch-up")
        self._first: dict[int, int] | None = None  # last_seen, read before connecting
        self._since: datetime | None = None  # everything sent before it was had
        self._session = 0
        self._caught_up = False  # the current session's catch-up took all it fetched
        self._connected = False

    async def load(self) -> None:
        """Read, before connecting, where the first session's catch-up starts."""
        self._first = await self._last_seen()
        self._since = await self._until()

    def ready(self, client: discord.Client, lanes: Lanes[int]) -> None:
        """A new gateway session began (READY): queue its catch-up."""
        self._session += 1
        self._caught_up, self._connected = False, True
        started, session = datetime.now(UTC), self._session
        seen, self._first = self._first, None
        if seen is not None:  # read before connecting: queued before any message arrives
            fetches = self._queue_found(client, lanes, seen)
            work = self._run(
                client, lanes, known=set(seen), fetches=fetches, started=started, session=session
            )
        else:
            logger.info("discord: new gateway session; fetching the messages sent meanwhile")
            work = self._again(client, lanes, started, session)
        self._tasks.spawn(work, name=f"discord-catch-up-{session}")

    def dropped(self) -> None:
        """The gateway connection was lost: what is sent from now on may be missed."""
        if self._caught_up and self._connected:
            self._since = datetime.now(UTC)
        self._connected = False

    def resumed(self) -> None:
        """The session was resumed: Discord replayed what was missed."""
        self._connected = True

    async def close(self) -> None:
        """Stop fetching (a catch-up cut short is not recorded)."""
        await self._tasks.close()

    async def stopped(self, at: datetime, *, lost: int) -> None:
        """The channel stopped taking messages at `at`, with `lost` of them never taken:
        record how far it had everything (nothing, if a message was lost)."""
        if lost:
            return
        moment = at if self._caught_up and self._connected else self._since
        if moment is not None:
            await self._record(moment)

    async def _again(
        self, client: discord.Client, lanes: Lanes[int], started: datetime, session: int
    ) -> None:
        seen = await self._last_seen()
        fetches = self._queue_found(client, lanes, seen)
        await self._run(
            client, lanes, known=set(seen), fetches=fetches, started=started, session=session
        )

    async def _run(
        self,
        client: discord.Client,
        lanes: Lanes[int],
        *,
        known: set[int],
        fetches: list[asyncio.Future[bool]],
        started: datetime,
        session: int,
    ) -> None:
        """Queue the allowed users' DMs beyond `known`, wait for every fetch, and record
        `started` if all of them took what they fetched."""
        complete, after = True, self._after()
        if after is not None:
            dms, complete = await self._open_dms(client, known)
            fetches += [self._queue(client, lanes, dm, after, known=False) for dm in dms]
        results = await asyncio.gather(*fetches)
        if not (complete and all(results)) or session != self._session:
            return  # the next catch-up reaches back as far as this one did
        self._caught_up = True
        self._since = max(started, self._since or started)
        await self._record(started)
        logger.info("discord: caught up ({} chat(s) read)", len(fetches))

    def _after(self) -> int | None:
        """The id before which every message was had (None: nothing says)."""
        return None if self._since is None else time_snowflake(self._since - CLOCK_MARGIN)

    def _queue_found(
        self, client: discord.Client, lanes: Lanes[int], seen: dict[int, int]
    ) -> list[asyncio.Future[bool]]:
        """Queue the chats in `seen` and the server channels found in discord.py's cache:
        all at once, so before any message that arrives from now on."""
        after = self._after()
        # What came before `after` was had: taken, or seen and refused (and would be
        # refused again), so a chat's history is read from the later of the two.
        fetches = [
            self._queue(client, lanes, chat, max(last, after or 0), known=True)
            for chat, last in seen.items()
        ]
        if after is None or not self._guilds:
            return fetches
        found = sorted(_readable_since(client, after, set(seen)), reverse=True)
        if len(found) > MAX_CHATS:
            logger.warning(
                "discord: {} server channels may have messages sent while nanobot was away; "
                "only the {} with the newest are read",
                len(found),
                MAX_CHATS,
            )
        fetches += [
            self._queue(client, lanes, chat, after, known=False) for _, chat in found[:MAX_CHATS]
        ]
        return fetches

    def _queue(
        self, client: discord.Client, lanes: Lanes[int], chat_id: int, after: int, *, known: bool
    ) -> asyncio.Future[bool]:
        """Queue in the chat's lane the taking of what it received after message `after`;
        the future says whether all of it was taken (it stays unset if the lanes close
        first: the catch-up waiting on it is cancelled then)."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        async def fetch() -> None:
            taken = False
            try:
                taken = await self._fetch(client, chat_id, after, known=known)
            finally:
                if not done.done():
                    done.set_result(taken)

        try:
            lanes.add(chat_id, fetch())
        except Closed:
            done.set_result(False)
        return done

    async def _fetch(
        self, client: discord.Client, chat_id: int, after: int, *, known: bool
    ) -> bool:
        """Take what chat `chat_id` received after message `after` (at most LIMIT, oldest
        first); whether all of it was taken. A chat that is gone or that the bot may not
        read has nothing to take. Runs in the chat's lane: never raises."""
        try:
            channel = client.get_channel(chat_id) or await client.fetch_channel(chat_id)
            if not isinstance(channel, discord.abc.Messageable):
                return True
            history = channel.history(
                after=discord.Object(id=after), oldest_first=True, limit=LIMIT
            )
            fetched = [message async for message in history]
        except (discord.NotFound, discord.Forbidden) as exc:
            logger.warning(
                "discord: chat {} cannot be read now ({}); nothing fetched", chat_id, exc
            )
            return True
        except _FAILURES as exc:
            logger.warning(
                "discord: could not fetch what chat {} received while nanobot was away: {}",
                chat_id,
                exc,
            )
            return False
        missed = [m for m in fetched if inbound.is_conversation(m)]
        if missed:
            logger.info(
                "discord: chat {}: {} message(s) {}; taking them{}",
                chat_id,
                len(missed),
                "after the last one taken" if known else "since nanobot last had everything",
                f" (only the first {LIMIT})" if len(fetched) >= LIMIT else "",
            )
        taken = True
        for message in missed:
            taken = await self._take(client, message) and taken
        return taken

    async def _open_dms(self, client: discord.Client, known: set[int]) -> tuple[list[int], bool]:
        """The DMs of the allowed users (the first MAX_CHATS) but those in `known`, and
        whether every one could be opened."""
        dms: list[int] = []
        complete = True
        for user_id in self._users[:MAX_CHATS]:
            try:
                dm = await client.create_dm(discord.Object(id=user_id))
            except _FAILURES as exc:
                logger.warning(
                    "discord: could not open the DM with allowed user {} to fetch what they "
                    "sent while nanobot was away: {}",
                    user_id,
                    exc,
                )
                complete = False
                continue
            if dm.id not in known:
                dms.append(dm.id)
        return dms, complete

    async def _last_seen(self) -> dict[int, int]:
        """Chat id → the newest message id intake took there lately ({} when it cannot say)."""
        if self._history is None:
            return {}
        try:
            seen = await self._history.last_seen(CHANNEL)
        except StoreError as exc:
            logger.warning(
                "discord: could not read which messages were taken ({}); messages sent while "
                "nanobot was away are not fetched",
                exc,
            )
            return {}
        return {int(c): int(m) for c, m in seen.items() if c.isdigit() and m.isdigit()}

    async def _until(self) -> datetime | None:
        if self._history is None:
            return None
        try:
            return await self._history.caught_up_until(CHANNEL)
        except StoreError as exc:
            logger.warning(
                "discord: could not read when nanobot last had every message ({}); chats "
                "without messages taken lately are not fetched",
                exc,
            )
            return None

    async def _record(self, moment: datetime) -> None:
        if self._history is None:
            return
        try:
            await self._history.caught_up(CHANNEL, moment)
        except StoreError as exc:
            logger.warning("discord: could not record how far messages were taken: {}", exc)


def _readable_since(client: discord.Client, after: int, skip: set[int]) -> list[tuple[int, int]]:
    """(last message id, chat id) of the guild text channels and active threads the bot may
    read whose last message is newer than `after`, but for those in `skip`."""
    found: list[tuple[int, int]] = []
    for guild in client.guilds:
        me = guild.me
        if me is None:
            continue
        chats: list[discord.TextChannel | discord.Thread] = [*guild.text_channels, *guild.threads]
        for chat in chats:
            last = chat.last_message_id
            if chat.id in skip or last is None or last <= after:
                continue
            try:
                allowed = chat.permissions_for(me)
            except discord.ClientException:  # a thread whose parent is not in the cache
                continue
            if allowed.view_channel and allowed.read_message_history:
                found.append((last, chat.id))
    return found
