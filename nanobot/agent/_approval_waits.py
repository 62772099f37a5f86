"""The approval requests the runs of this process wait on: one waiter each, woken when the
request is decided (here, or by another member of a cluster), and which session each waits
in (`Approver.waiting_in`: a message queued there is told why it is not read yet)."""

from __future__ import annotations

import asyncio

from nanobot.store import ApprovalRequest


class Waits:
    """The waiting requests, by id and by session."""

    def __init__(self) -> None:
        self._waiters: dict[str, asyncio.Future[None]] = {}
        self._asking: dict[str, ApprovalRequest] = {}  # session key -> the request it waits on

    def __len__(self) -> int:
        """How many requests runs wait on."""
        return len(self._waiters)

    def begin(self, request: ApprovalRequest) -> asyncio.Future[None]:
        """A run waits on `request` from now; the future is set when it is decided."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[request.id] = waiter
        self._asking[request.asked.session_key] = request
        return waiter

    def end(self, request: ApprovalRequest) -> None:
        """The run waits on `request` no more (decided, expired, or the run stopped)."""
        self._waiters.pop(request.id, None)
        if self._asking.get(request.asked.session_key) is request:
            del self._asking[request.asked.session_key]

    def wake(self, request_id: str) -> bool:
        """Wake the run waiting on `request_id`; False if none waits here."""
        waiter = self._waiters.get(request_id)
        if waiter is None or waiter.done():
            return False
        waiter.set_result(None)
        return True

    def in_session(self, session_key: str) -> ApprovalRequest | None:
        """The request a run of `session_key` waits on, if one does."""
        return self._asking.get(session_key)
