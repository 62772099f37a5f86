"""The "typing…" indicator a chat shows while the agent works on a turn there."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nanobot.bus.events import ChatRef, Typing
from nanobot.tasks import TaskSet

Send = Callable[[ChatRef], Awaitable[None]]
DELAY = 1.0  # seconds into a turn before "typing…" is shown
# Signals per second over all chats of a channel. Telegram takes about 30 messages a second
# from a bot before it answers 429; "typing…" must never use up what replies need.
RATE = 10.0


@dataclass(slots=True)
class _Chat:
    task: asyncio.Task[None]
    turns: int = 1


class TypingIndicator:
    """One "typing…" indicator per chat while any turn runs there.

    Platforms show the signal for a few seconds only, so a task per chat calls
    `send(chat)` every `interval` seconds, the first time `delay` seconds after the turn
    began: a reply that comes sooner needs no indicator (Telegram's advice too), and
    skipping it saves a platform call per quick turn. Turns are counted: a chat's task
    starts with its first `Typing(active=True)` and ends with the matching last
    `active=False`.

    Over all chats, at most `rate` signals a second go out (bursts up to `rate`); a signal
    beyond that is skipped, not delayed, as a late one tells nothing: under a burst of
    turns, replies get the platform's rate limit, not "typing…".

    The indicator owns these tasks (named `{name}-typing-{chat id}`). It takes updates only
    between `start()` and `stop()`, which the channel calls as it connects and disconnects:
    `stop()` cancels and awaits every task, and updates until the next `start()` are
    ignored, so no task outlives the connection. `send` must not raise (a failed signal is
    only logged) and may be cancelled at any await.
    """

    def __init__(
        self, send: Send, interval: float, *, delay: float = DELAY, rate: float = RATE, name: str
    ) -> None:
        self._send = send
        self._interval = interval
        self._delay = delay
        self._name = name
        self._budget = _Budget(rate)
        self._chats: dict[ChatRef, _Chat] = {}
        self._tasks = TaskSet(f"{name}-typing")
        self._started = False

    def start(self) -> None:
        """Take updates from now on (again, after a `stop()`)."""
        self._started = True

    async def update(self, signal: Typing) -> None:
        """Count a turn in, or out; the last one out cancels the chat's task and awaits it."""
        current = self._chats.get(signal.chat)
        if signal.active:
            if not self._started:
                return  # not connected; and nothing would stop the task
            if current is not None:
                current.turns += 1
            else:
                name = f"{self._name}-typing-{signal.chat.chat_id}"
                task = self._tasks.spawn(self._keep_typing(signal.chat), name=name)
                self._chats[signal.chat] = _Chat(task)
        elif current is not None:
            current.turns -= 1
            if current.turns <= 0:
                del self._chats[signal.chat]
                await _cancel(current.task)

    async def stop(self) -> None:
        """Cancel and await every chat's task; ignore updates until `start()`."""
        self._started = False
        self._chats.clear()
        await self._tasks.close()

    async def _keep_typing(self, chat: ChatRef) -> None:
        await asyncio.sleep(self._delay)
        while True:
            if self._budget.take():
                await self._send(chat)
            await asyncio.sleep(self._interval)


class _Budget:
    """A token bucket: `rate` tokens a second, holding at most `rate`."""

    def __init__(self, rate: float) -> None:
        self._rate = rate
        self._tokens = rate
        self._at: float | None = None

    def take(self) -> bool:
        """Spend a token if there is one."""
        now = asyncio.get_running_loop().time()
        if self._at is not None:
            self._tokens = min(self._rate, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.wait([task])  # unlike `await task`, never swallows our own cancellation
