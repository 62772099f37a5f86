"""`nanobot pairing`: the requests of people who wrote to the bot, and who was approved."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from nanobot import log
from nanobot.config import Config
from nanobot.manage._command import config_zone, on_store, shown, when
from nanobot.store import Access


def pairing(config: Config, action: str, *args: str) -> tuple[list[str], bool]:
    """Run a `nanobot pairing` action; returns the lines to print and whether it succeeded."""
    log.configure(config, quiet=True)
    actions: dict[str, Callable[..., Awaitable[tuple[list[str], bool]]]] = {
        "approve": _approve,
        "deny": _deny,
        "revoke": _revoke,
    }

    if action == "list":
        return on_store(config, lambda db: _pairing_list(Access(db), config))
    return on_store(config, lambda db: actions[action](Access(db), *args))


async def _approve(access: Access, code: str) -> tuple[list[str], bool]:
    request = await access.approve(code)
    if request is None:
        return [f"No pending request has the code {code} (or it expired)."], False
    who = f"{shown(request.name, 'user')} ({request.channel} id {request.user_id})"
    return [f"Approved {who}. They can talk to nanobot now."], True


async def _deny(access: Access, code: str) -> tuple[list[str], bool]:
    if await access.deny(code):
        return [f"Denied request {code.upper()}."], True
    return [f"No pending request has the code {code}."], False


async def _revoke(access: Access, user: str, channel: str | None = None) -> tuple[list[str], bool]:
    if await access.revoke(user, channel):
        return [f"Revoked user {user}."], True
    return [f"User {user} was not approved by pairing."], False


async def _pairing_list(access: Access, config: Config) -> tuple[list[str], bool]:
    lines = ["Pending requests:"]
    pending = await access.pending()
    zone = config_zone(config)
    for r in pending:
        who = f"{r.channel} user {r.user_id} ({shown(r.name)})"
        lines.append(f"  {r.code}  {who}, until {when(r.expires_at, zone)}")
    if not pending:
        lines.append("  none")
    lines.append("Allowed by the config (allow_from):")
    listed = [(n, getattr(config.channels, n)) for n in ("telegram", "discord")]
    for name, channel in listed:
        if channel.enabled and channel.allow_from:
            everyone = "*" in channel.allow_from
            ids = "everyone" if everyone else ", ".join(str(u) for u in channel.allow_from)
            lines.append(f"  {name}: {ids}")
    if not any(c.enabled and c.allow_from for _, c in listed):
        lines.append("  none")
    lines.append("Approved users:")
    allowed = await access.allowed()
    for u in allowed:
        lines.append(
            f"  {u.channel} user {u.user_id} ({shown(u.name)}), since {u.approved_at:%Y-%m-%d}"
        )
    if not allowed:
        lines.append("  none")
    return lines, True
