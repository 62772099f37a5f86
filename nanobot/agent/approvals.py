"""Approvals policy: which tool calls ask a person first, what a saved rule binds to, who may
decide and where they are asked, and the words for every outcome.

Pure: no I/O and no clock. The store (`nanobot.store.approvals`) keeps requests, rules and the
log; the loop asks, waits and runs. A call goes through three steps:

1. `ApprovalPolicy.requirement(tool, arguments)`: `allow` runs it, `deny` refuses it, `ask`
   goes on (cheap, so plainly allowed tools never touch the store);
2. the store's `match(subject.tool, subject.rule_key, turn)`: the grants saved for this
   person or place; one holds only while the code it approved is unchanged (for exec, the
   approver compares fingerprints, `nanobot.agent.code_pins`; `voided` says why not);
3. `ApprovalPolicy.check(…, grant=…, taint=…)`: run it, or ask with the reason the card shows.
   Once a turn has taken in content from outside (`Taint`), every call that would ask asks
   even when a saved rule or a chat grant would allow it; a tool configured `allow` stays
   allowed, except a fetch that could carry what the turn read out to a host it has not
   fetched from yet (`egress`): that asks, and "always" then means "for this host".

Then `route(origin, approvers, …)` says where the card goes and who may decide, or that the call
is refused at once (`_approval_routes.py`); `new_request` makes the row for the store; the words
for every outcome are `_approval_words.py`. Import all of it from here (`__all__`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from types import MappingProxyType
from typing import Final, Literal
from urllib.parse import urlsplit

from nanobot.agent._approval_routes import (
    AskApprovers,
    AskHere,
    Origin,
    RefuseNow,
    Route,
    Unattended,
    route,
)
from nanobot.agent._approval_words import answer_text, decision_text, not_run
from nanobot.agent._commands import command_key, inline_code
from nanobot.store.approvals import Grant, NewRequest, Place, Scope, Verdict

__all__ = [
    "DEFAULT_POLICIES",
    "ApprovalPolicy",
    "AskApprovers",
    "AskHere",
    "Check",
    "Origin",
    "Policy",
    "RefuseNow",
    "Route",
    "Scope",
    "Subject",
    "Taint",
    "ToolRule",
    "ToolRules",
    "Unattended",
    "Verdict",
    "answer_text",
    "command_key",
    "decision_text",
    "egress",
    "egress_reason",
    "egress_subject",
    "inline_code",
    "new_request",
    "no_rules",
    "not_run",
    "route",
    "subject",
    "voided",
]

Policy = Literal["allow", "ask", "deny"]
"""What a tool's calls get: run without asking, ask a person first, or never run."""

DEFAULT_POLICIES: Final[Mapping[str, Policy]] = MappingProxyType(
    {
        "exec": "ask",
        "cron": "ask",  # creating or changing jobs; listing them is always allowed
        "spawn": "allow",  # a subagent's own calls follow this same policy
        "read_file": "allow",
        "write_file": "allow",
        "edit_file": "allow",
        "list_dir": "allow",
        "web_fetch": "allow",
        "web_search": "allow",
        "message": "allow",
        "memory_search": "allow",  # reads what was said and the memory files
        "memory_get": "allow",
    }
)
"""The built-in tools and their defaults; any other tool (MCP, later ones) asks."""
OTHER_TOOLS: Final = "other"
"""The config key (`tools.approval.other`) for tools not listed in `DEFAULT_POLICIES`."""
DEFAULT_TIMEOUT: Final = timedelta(minutes=10)
UNTRUSTED_TOOLS: Final = frozenset({"web_fetch", "web_search"})
"""Built-in tools whose results come from outside; results of tools that are not built in
(MCP) do as well."""
# Actions of a tool that change nothing, allowed even where the tool asks.
_READ_ONLY_ACTIONS: Final[Mapping[str, frozenset[str]]] = MappingProxyType(
    {"cron": frozenset({"list"})}
)
_ALL_SCOPES: Final[tuple[Scope, ...]] = ("once", "chat", "always")
_HASH_LENGTH: Final = 16  # hex digits: 64 bits, and room in a 64-byte callback_data


@dataclass(frozen=True, slots=True)
class Subject:
    """What a call is, for approving it: `arguments` as the card shows them (canonical JSON)
    and their hash; `rule_key`, what a rule or grant binds to (the normalised command for
    exec, the canonical arguments otherwise); `scopes`, the approvals it may get besides a
    denial, with `once_only` saying why the others are not offered."""

    tool: str
    arguments: str
    args_hash: str
    rule_key: str
    scopes: tuple[Scope, ...]
    once_only: str | None = None


def subject(tool: str, arguments: Mapping[str, object]) -> Subject:
    """The `Subject` of a call of `tool` with these (parsed) arguments.

    A command that runs code given inline (see `inline_code`) may be approved once only: not
    for the chat and never always, since the same words can run different code next time.
    """
    canonical = canonical_json(arguments)
    digest = hashlib.sha256(f"{tool}\0{canonical}".encode()).hexdigest()[:_HASH_LENGTH]
    command = arguments.get("command") if tool == "exec" else None
    if not isinstance(command, str):
        return Subject(tool, canonical, digest, canonical, _ALL_SCOPES)
    reason = inline_code(command)
    scopes: tuple[Scope, ...] = _ALL_SCOPES if reason is None else ("once",)
    return Subject(tool, canonical, digest, command_key(command), scopes, reason)


def egress(tool: str, arguments: Mapping[str, object]) -> str | None:
    """The host a call sends a request of the agent's choosing to (web_fetch's URL's host,
    lowercase), or None for any other call. A web_search query goes only to the configured
    search provider, never to a host the model picks: it is not one."""
    url = arguments.get("url") if tool == "web_fetch" else None
    if not isinstance(url, str):
        return None
    try:
        host = urlsplit(url.strip()).hostname
    except ValueError:
        host = None
    return host.rstrip(".") if host else f"an unreadable URL ({url[:80]})"


def egress_subject(tool: str, arguments: Mapping[str, object], host: str) -> Subject:
    """The `Subject` of a fetch from a tainted turn to `host`: a saved rule for it is "always
    for this host" (rule key `host:<host>`); a chat-wide grant is not offered."""
    plain = subject(tool, arguments)
    if host.startswith("an unreadable URL"):
        return replace(plain, scopes=("once",), once_only="its host cannot be told")
    return replace(plain, rule_key=f"host:{host}", scopes=("once", "always"))


def egress_reason(host: str, taint: Taint) -> str:
    """Why a fetch from a tainted turn asks, for the card."""
    return (
        f"{taint.reason}, and a request to {host}, which this turn has not fetched from yet,"
        " could carry what it read out in its address"
    )


def canonical_json(arguments: Mapping[str, object]) -> str:
    """The arguments as one JSON text: sorted keys, no blanks, non-ASCII as itself."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class Taint:
    """What content from outside the turn has taken in so far (empty: none). Per turn: start
    each turn with `Taint()`."""

    sources: tuple[str, ...] = ()

    def after(self, tool: str) -> Taint:
        """The taint once a result of `tool` is in: web_fetch, web_search and every tool that
        is not built in bring content from outside."""
        if tool in UNTRUSTED_TOOLS or tool not in DEFAULT_POLICIES:
            return self.with_source(f"a {tool} result")
        return self

    def with_source(self, source: str) -> Taint:
        """The taint once `source` is in ("a file sent in the chat", "a subagent's result")."""
        return self if source in self.sources else Taint((*self.sources, source))

    @property
    def reason(self) -> str | None:
        """Why the turn is not trusted, for the card; None when it is."""
        if not self.sources:
            return None
        return f"this turn has read content from outside ({', '.join(self.sources)})"


@dataclass(frozen=True, slots=True)
class ToolRule:
    """The policy of a tool that is not built in (an MCP server's), the config key that set
    it (named on the card and in a refusal), and what the card says of it besides (`note`:
    the server's own annotations)."""

    policy: Policy
    key: str
    note: str = ""


ToolRules = Callable[[str], ToolRule | None]
"""The rule of a tool by its name, for tools that are not built in (None: `other`'s)."""


def no_rules(tool: str) -> ToolRule | None:
    """The `ToolRules` of an install with no tools but the built-in ones."""
    return None


@dataclass(frozen=True, slots=True)
class Check:
    """What to do with a call: run it (`allow`), ask a person (`ask`) or refuse it (`deny`).
    `reason` says why, for the card or the model; `grant` is what allowed it, if anything."""

    action: Policy
    reason: str = ""
    grant: Grant | None = None


@dataclass(frozen=True, slots=True)
class ApprovalPolicy:
    """`tools.approval`: each tool's policy (tools not in `tools` get `other`), how long a
    request waits, and what unattended turns do."""

    tools: Mapping[str, Policy] = field(default_factory=lambda: DEFAULT_POLICIES)
    other: Policy = "ask"
    timeout: timedelta = DEFAULT_TIMEOUT
    unattended: Unattended = "ask"
    rules: ToolRules = no_rules  # tools that are not built in: the MCP servers' own rules

    def requirement(self, tool: str, arguments: Mapping[str, object]) -> Policy:
        """The tool's policy for this call; `ask` becomes `allow` for an action that changes
        nothing (`cron` `list`). A call whose action is missing or unknown keeps the policy."""
        policy = self.tools.get(tool)
        if policy is None:
            rule = self.rules(tool)
            policy = rule.policy if rule is not None else self.other
        if policy == "ask" and arguments.get("action") in _READ_ONLY_ACTIONS.get(tool, ()):
            return "allow"
        return policy

    def check(
        self,
        tool: str,
        arguments: Mapping[str, object],
        *,
        grant: Grant | None,
        taint: Taint,
    ) -> Check:
        """Whether this call runs, asks or is refused, given the grant the store matched for
        it (None if none) and the turn's taint."""
        need = self.requirement(tool, arguments)
        rule = None if tool in self.tools else self.rules(tool)
        key = rule.key if rule is not None else f"tools.approval.{_key(tool, self.tools)}"
        if need == "allow":
            return Check("allow")
        if need == "deny":
            return Check("deny", f"{tool} is turned off ({key}: deny)")
        note = f"; {rule.note}" if rule is not None and rule.note else ""
        if grant is not None and taint.reason is None:
            return Check("allow", _granted(grant), grant)
        if grant is not None:
            return Check("ask", f"{_granted(grant)} would allow it, but {taint.reason}{note}")
        why = _why_it_asks(tool, key, mcp=rule is not None) + note
        return Check("ask", why if taint.reason is None else f"{why}; {taint.reason}")


def _granted(grant: Grant) -> str:
    return f"saved rule {grant.rule_id}" if grant.scope == "always" else "this chat's approval"


def voided(grant: Grant, why: str) -> str:
    """Why a grant the store matched does not apply (the code it approved changed), for the
    card: "saved rule 1a2b3c4d no longer applies: tool.py changed"."""
    return f"{_granted(grant)} no longer applies: {why}"


def _key(tool: str, tools: Mapping[str, Policy]) -> str:
    return tool if tool in tools else OTHER_TOOLS


def _why_it_asks(tool: str, key: str, *, mcp: bool = False) -> str:
    if tool == "cron":
        return "creating or changing scheduled jobs asks first (tools.approval.cron: ask)"
    if mcp:
        return f"{tool} is a tool of an MCP server; it asks first ({key}: ask)"
    if key.endswith(f".{OTHER_TOOLS}"):
        return f"{tool} is not a built-in tool; those ask first ({key}: ask)"
    return f"{tool} asks first ({key}: ask)"


def new_request(
    call: Subject,
    *,
    session_key: str,
    run_id: str,
    tool_call_id: str,
    reason: str,
    deciders: Collection[str],
    places: Collection[Place],
    owner: str | None = None,
    fingerprint: str = "",
) -> NewRequest:
    """The store row for asking about `call`; its scopes come from the subject, so inline
    code can never be saved. `owner` is the person whose private turn it is (a rule binds to
    them; None: to the session), `fingerprint` the code a rule would approve."""
    return NewRequest(
        session_key=session_key,
        run_id=run_id,
        tool_call_id=tool_call_id,
        tool=call.tool,
        arguments=call.arguments,
        args_hash=call.args_hash,
        rule_key=call.rule_key,
        scopes=call.scopes,
        reason=reason,
        deciders=tuple(deciders),
        places=tuple(places),
        owner=owner,
        fingerprint=fingerprint,
    )
