"""The approver: asks people in chat before a tool call that needs it, and waits.

For every call of a run, `RunApproval.approve` applies the policy (`approvals.py`): allowed
calls run at once; a call that asks gets a request row in the store, a card with buttons in
the chat of the turn (or, in a group, in each approver's private chat, with a note in the
group), and the run waits in `awaiting_human` until someone who may decide does, the request
expires, or the run is stopped. A decision comes back as a chat command (`/approve ID once`,
a button press is one) through the gate and the dispatcher to `command`; the first answer
wins in the store, and the waiting run is woken. Cards are outbound records: durable, and
edited to say what became of them.

A saved rule or chat grant is matched for the person and place of the turn (`Turn`), and for
exec holds only while the files the command runs are as they were when it was saved (their
fingerprint, `code_pins`, computed in a thread); a command whose code cannot be pinned is
offered "once" only. After content from outside, a web_fetch to a host the turn has not
fetched from asks even though web_fetch is allowed (`egress`).

After a restart, requests still pending are expired and their cards edited (`recover`); the
turn resumes and its call gets "not run".
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import cast
from weakref import WeakValueDictionary

from loguru import logger

from nanobot.agent._approval_waits import Waits
from nanobot.agent._grants import holding, pinned
from nanobot.agent._run_approval import RunApproval, fetched_once
from nanobot.agent.approval_cards import listing, too_long
from nanobot.agent.approval_posts import Cards, placing
from nanobot.agent.approvals import (
    ApprovalPolicy,
    AskApprovers,
    AskHere,
    Origin,
    Subject,
    Taint,
    answer_text,
    egress,
    egress_reason,
    egress_subject,
    new_request,
    not_run,
    route,
    subject,
)
from nanobot.agent.run import Approval, Asking
from nanobot.bus.events import ChatRef, InboundMessage
from nanobot.bus.queue import MessageBus
from nanobot.log import printable
from nanobot.providers.base import ToolCall
from nanobot.store import ApprovalRequest, ApprovalStore, Journal
from nanobot.store.approvals import ASKER_GONE, RESTARTED, LogOutcome, Turn, Verdict
from nanobot.store.wakeups import APPROVAL, Wakeups

STOPPED = "the turn was stopped"
ASK_HELP = (
    "Usage: /approve ID [once|chat|always], /deny ID, /approvals (the requests waiting and "
    "the saved rules)."
)


@dataclass(frozen=True, slots=True)
class Caller:
    """Whose turn a call is made in: its session, the chat it talks in (None: it delivers
    nowhere), who is talking there, and whether nobody is (cron, the heartbeat)."""

    session_key: str
    chat: ChatRef | None
    user_id: str | None = None
    private: bool = True
    unattended: bool = False
    untrusted: tuple[str, ...] = ()  # content from outside the turn started with


class Approver:
    """Asks, waits and decides; one per process. `approvers` is each channel's configured
    approvers (`channels.<name>.approvers`); `wakeups`, in a cluster, is what tells the
    other members of each decision (the run that waits for it may be theirs: they call
    `decided`)."""

    def __init__(
        self,
        store: ApprovalStore,
        policy: ApprovalPolicy,
        approvers: Mapping[str, Collection[str]],
        journal: Journal,
        bus: MessageBus,
        *,
        workspace: Path,
        wakeups: Wakeups | None = None,
    ) -> None:
        self._store = store
        self._policy = policy
        self._approvers = {k: tuple(v) for k, v in approvers.items()}
        self._cards = Cards(store, journal, bus, workspace=workspace)
        self._workspace = workspace
        self._waits = Waits()
        self._wakeups = wakeups
        self.restarted: dict[str, str] = {}  # tool call id -> its result, from `recover`
        # The hook of each run still going on, by run id: a run's hooks hold it, so it is
        # dropped once its run is over, however the run ended.
        self._runs: WeakValueDictionary[str, RunApproval] = WeakValueDictionary()

    def is_approver(self, channel: str, user_id: str) -> bool:
        """Whether `user_id` is one of `channel`'s configured approvers."""
        return user_id in self._approvers.get(channel, ())

    def decided(self, request_id: str) -> None:
        """Request `request_id` was decided, maybe by another process: wake its run if it
        waits here (it reads the decision from the store)."""
        self._waits.wake(request_id)

    def waiting_in(self, session_key: str) -> ApprovalRequest | None:
        """The request a run of `session_key` waits on in this process, if one does."""
        return self._waits.in_session(session_key)

    def for_run(self, caller: Caller, run_id: str) -> RunApproval:
        taint = Taint()
        for source in caller.untrusted:
            taint = taint.with_source(source)
        run = RunApproval(self, caller, run_id, taint)
        self._runs[run_id] = run
        return run

    def taint_of(self, run_id: str) -> Taint:
        """What the run `run_id`, going on now, has taken in from outside so far (what it
        started with included): a subagent it starts inherits it. Empty for a run that is
        not going on, or was not made by `for_run`."""
        run = self._runs.get(run_id)
        return Taint() if run is None else run.taint

    async def check(self, run: RunApproval, call: ToolCall) -> Approval:
        """Run `call` (None), refuse it now (the result text), or ask (`Asking`)."""
        configured = self._policy.tools.get(call.name, self._policy.other)
        if configured == "allow" and call.name != "web_fetch":
            return None  # most calls: no need to parse their arguments twice
        try:
            arguments = call.parsed_arguments()
        except ValueError:
            return None  # the runner answers bad arguments itself; nothing would run
        need = self._policy.requirement(call.name, arguments)
        if need == "allow":
            return await self._egress(run, call, arguments)
        what, fingerprint = subject(call.name, arguments), ""
        grant, void = None, None
        if need == "ask":
            what, fingerprint = await pinned(what, arguments, self._workspace)
            grant, void = await holding(self._store, what, _turn(run.caller), fingerprint)
        check = self._policy.check(call.name, arguments, grant=grant, taint=run.taint)
        if check.action == "allow":
            await self._record(what, run, "allowed", check.reason)
            self._fetched(run, call.name, arguments)
            return None
        if check.action == "deny":
            return await self._refuse(what, run, check.reason)
        why = check.reason if void is None else f"{void}; {check.reason}"
        return await self._ask(run, call, what, why, fingerprint=fingerprint)

    async def _egress(
        self, run: RunApproval, call: ToolCall, arguments: Mapping[str, object]
    ) -> Approval:
        """A call its tool's policy allows: it runs, unless it is a fetch from a tainted turn
        to a host the turn has not fetched from, with no rule of this person's for it."""
        host = egress(call.name, arguments)
        if host is None:
            return None
        if run.taint.reason is None or host in run.hosts:
            run.hosts.add(host)
            return None
        what = egress_subject(call.name, arguments, host)
        if "always" in what.scopes:
            grants = await self._store.match(what.tool, what.rule_key, _turn(run.caller))
            if grants:
                await self._record(what, run, "allowed", f"saved rule {grants[0].rule_id}")
                run.hosts.add(host)
                return None
        asking = await self._ask(run, call, what, egress_reason(host, run.taint), host=host)
        if not isinstance(asking, Asking):
            return asking
        return Asking(fetched_once(run, host, asking.decision))

    def _fetched(self, run: RunApproval, tool: str, arguments: Mapping[str, object]) -> None:
        host = egress(tool, arguments)
        if host is not None:
            run.hosts.add(host)

    async def _ask(
        self,
        run: RunApproval,
        call: ToolCall,
        what: Subject,
        why: str,
        *,
        fingerprint: str = "",
        host: str | None = None,
    ) -> Approval:
        caller = run.caller
        long = too_long(what.tool, what.arguments)
        if long is not None:
            return await self._refuse(what, run, f"it cannot be shown whole to approve it: {long}")
        origin = None
        if caller.chat is not None:
            chat = caller.chat
            origin = Origin(
                chat.channel, chat.chat_id, caller.private, caller.user_id, caller.unattended
            )
        where = route(
            origin,
            self._approvers.get(caller.chat.channel, ()) if caller.chat else (),
            unattended=self._policy.unattended,
        )
        if not isinstance(where, AskHere | AskApprovers):
            return await self._refuse(what, run, where.reason)
        assert caller.chat is not None
        deciders, places = placing(where, caller.chat, caller.user_id, private=caller.private)
        request = await self._store.create(
            new_request(
                what,
                session_key=caller.session_key,
                run_id=run.run_id,
                tool_call_id=call.id,
                reason=why,
                deciders=deciders,
                places=places,
                owner=caller.user_id if caller.private else None,
                fingerprint=fingerprint,
            ),
            expires_in=self._policy.timeout,
        )
        logger.info(
            "approval {} asked for {} in {} (deciders: {}): {}",
            request.id,
            call.name,
            caller.session_key,
            ", ".join(deciders),
            why,
        )
        group = None if caller.private else caller.chat
        await self._cards.ask(request, places, group=group, once_only=what.once_only, host=host)
        return Asking(self._wait(request))

    async def _wait(self, request: ApprovalRequest) -> str | None:
        waiter = self._waits.begin(request)
        try:
            seconds = (request.expires_at - datetime.now(UTC)).total_seconds()
            try:
                async with asyncio.timeout(max(0.0, seconds)):
                    await waiter
            except TimeoutError:
                pass
            decision = await self._store.expire(request.id)  # no-op once decided
        except asyncio.CancelledError:
            await asyncio.shield(self._withdraw(request, STOPPED))
            raise
        finally:
            self._waits.end(request)
        final = decision.request or request
        if decision.won:
            logger.info("approval {} expired: nobody decided in time", request.id)
        await self._cards.show(final)
        return None if final.state == "approved" else not_run(final)

    async def _withdraw(self, request: ApprovalRequest, note: str) -> None:
        decision = await self._store.cancel(request.id, note)
        if decision.request is not None:
            logger.info("approval {} cancelled: {}", request.id, note)
            await self._cards.show(decision.request)

    async def command(self, message: InboundMessage) -> str:
        """Answer `/approve`, `/deny` or `/approvals` from `message` (typed, or a button
        pressed); the line to answer with."""
        words = message.text.split()
        name = words[0][1:].split("@", 1)[0].lower()
        if name == "approvals":
            return await self.describe(message)
        verdict: Verdict
        if name == "deny" and len(words) in (2, 3):
            verdict, args_hash = "deny", (words[2] if len(words) == 3 else None)
        elif name == "approve" and 2 <= len(words) <= 4:
            scope = words[2].lower() if len(words) > 2 else "once"
            if scope not in ("once", "chat", "always"):
                return ASK_HELP
            verdict = cast(Verdict, scope)
            args_hash = words[3] if len(words) == 4 else None
        else:
            return ASK_HELP
        chat_id = f"@{message.sender_id}" if message.is_private else message.chat.chat_id
        decision = await self._store.decide(
            words[1],
            verdict,
            by=message.sender_id,
            channel=message.chat.channel,
            chat_id=chat_id,
            args_hash=args_hash,
            by_name=message.sender_name or None,
        )
        if decision.won:
            logger.info("approval {}: {} by {}", words[1], verdict, printable(message.sender_id))
            request = decision.request
            if request is not None and not self._waits.wake(request.id):  # not waiting here
                if self._wakeups is not None:
                    await self._tell_others(self._wakeups, request.id)
                else:
                    await self._cards.show(request)  # its run is gone
        else:
            logger.info(
                "approval {}: answer by {} refused: {}",
                printable(words[1]),
                printable(message.sender_id),
                decision.outcome,
            )
        return answer_text(decision.outcome, decision.request)

    async def _tell_others(self, wakeups: Wakeups, request_id: str) -> None:
        """Wake the run waiting for `request_id` in another member, if one does."""
        try:
            await wakeups.notify(APPROVAL, request_id)
        except Exception as exc:  # noqa: BLE001 - the decision is stored: it is read at expiry
            logger.warning(
                "approval {}: could not tell the other members ({}); its run goes on when "
                "the request would have expired",
                request_id,
                exc,
            )

    async def describe(self, message: InboundMessage) -> str:
        """`/approvals` for its sender: the pending requests of their own turns and those
        they may decide, and the saved rules that apply to their turns (an approver's: also
        the groups'). In a group only how many: the calls are not for everyone there."""
        channel, me = message.chat.channel, message.sender_id
        approver = me in self._approvers.get(channel, ())
        pending = [
            request
            for request in await self._store.pending()
            if request.asked.channel == channel
            and (me in request.asked.deciders or request.asked.owner == me)
        ]
        rules = [
            rule
            for rule in await self._store.rules(channel=channel)
            if rule.user_id == me
            or rule.session_key == message.session_key
            or (approver and rule.session_key is not None)
        ]
        return listing(pending, rules, me=me, private=message.is_private)

    async def new_session(self, session_key: str) -> None:
        """`/new`: what was allowed for this chat is not any more."""
        await self._store.clear_chat_scope(session_key)

    async def stop(self, run_id: str) -> None:
        """`/stop`: the run's requests are cancelled (its waits end with the run)."""
        for request in await self._store.cancel_run(run_id, STOPPED):
            await self._cards.show(request)

    async def recover(self, *, alone: bool = True) -> None:
        """At start, before turns resume: expire what was pending (the runs that waited are
        gone), edit those cards, and remember each call's result for the resumed turn. Not
        `alone` (a member of a cluster): only what no live member's session waits for."""
        await self._settle(await self._store.expire_pending(RESTARTED, spare_held=not alone))

    async def taken_over(self, session_key: str) -> None:
        """Before the turn of a session taken over from a dead member resumes: settle that
        member's pending requests as a restart does (its run waits nowhere any more)."""
        await self._settle(await self._store.expire_pending(ASKER_GONE, session_key=session_key))

    async def _settle(self, expired: list[ApprovalRequest]) -> None:
        for request in expired:
            logger.info("approval {} expired: {}", request.id, request.note)
            self.restarted[request.asked.tool_call_id] = not_run(request)
            await self._cards.show(request)

    async def _refuse(self, what: Subject, run: RunApproval, reason: str) -> str:
        await self._record(what, run, "refused", reason)
        logger.info("{} refused in {}: {}", what.tool, run.caller.session_key, reason)
        return not_run(refused=reason)

    async def _record(
        self, what: Subject, run: RunApproval, outcome: LogOutcome, reason: str
    ) -> None:
        await self._store.record(
            tool=what.tool,
            arguments=what.arguments,
            outcome=outcome,
            reason=reason,
            session_key=run.caller.session_key,
            request_id=None,
        )


def _turn(caller: Caller) -> Turn:
    """Whose turn it is, for matching saved rules: a person only in their private turn."""
    channel = caller.chat.channel if caller.chat is not None else ""
    return Turn(caller.session_key, channel, caller.user_id if caller.private else None)
