"""Telegram webhook mode: Telegram POSTs each update to us, and is answered 200 once it is taken.

Telegram sends every update (a message, a button press) to the webhook URL it was given with
`setWebhook`, with the secret token in the `X-Telegram-Bot-Api-Secret-Token` header, and
sends it again later until it is answered with a 2xx. So an update is answered 200 only once
`take` has returned True for it, that is once the gate journaled it (or deliberately left it);
anything else leaves it with Telegram: 503 when it could not be stored now (intake stopped by
a store failure, or the gateway stopping), 500 when reading it failed. A redelivery of an
update taken before is recognised by the journal and answered 200 without a second turn.
Several gateways sharing one store may all serve the webhook URL (behind one proxy): whichever
takes an update, the journal keeps it once.

A request without the right secret token is refused (403) before its body is read, and
nothing of it is journaled; a body that is no update is refused with 400. Updates of one chat
are taken in the order they arrive (`nanobot.lanes`), those of different chats concurrently,
and each button press in a lane of its own, as when polling.

The webhook stays set when the gateway stops: other gateways of a cluster may still be taking
updates, and Telegram keeps what nobody answered until one comes back. A gateway started in
polling mode deletes it (getUpdates is refused while a webhook is set).
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Callable, Coroutine
from typing import Any, Final, Protocol

from aiohttp import web
from loguru import logger
from telegram import Bot, Update
from telegram.error import BadRequest

from nanobot.channels._settings import Secret
from nanobot.channels._telegram_poll import ALLOWED, Lane, lane
from nanobot.channels.base import ChannelRefused
from nanobot.errors import StoreError
from nanobot.lanes import Closed, Lanes

SECRET_HEADER: Final = "X-Telegram-Bot-Api-Secret-Token"
SHUTDOWN_GRACE: Final = 2.0  # seconds a stop lets requests being taken finish
MAX_BODY: Final = 1024 * 1024  # bytes; an update is a few kB
WARNED_SOURCES: Final = 256  # sources whose refusals were logged at warning, at most

Take = Callable[[Update], Coroutine[Any, Any, bool]]
"""Takes one update, as `_telegram_poll.Take` says (a coroutine: it runs in its chat's lane)."""


class WebhookSettings(Protocol):
    """`channels.telegram.webhook` as the channel reads it (`url` None: polling)."""

    @property
    def url(self) -> str | None: ...
    @property
    def secret_token(self) -> Secret | None: ...
    @property
    def max_connections(self) -> int | None: ...
    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def served_path(self) -> str: ...


class Webhook:
    """Serves the webhook for `bot` and takes every update with `take`; see the module
    docstring. Made in the running loop, one per run: `run(ready)` once."""

    def __init__(
        self, bot: Bot, take: Take, settings: WebhookSettings, *, grace: float = SHUTDOWN_GRACE
    ) -> None:
        if settings.url is None or settings.secret_token is None:
            raise ValueError("webhook mode needs a url and a secret token")
        self._bot = bot
        self._take = take
        self._settings = settings
        self._url = settings.url
        self._secret = settings.secret_token.get_secret_value().encode()
        self._grace = grace
        self._lanes: Lanes[Lane] = Lanes(name="telegram-webhook")
        self._warned: set[str] = set()

    async def run(self, ready: Callable[[], None]) -> None:
        """Listen, register the webhook with Telegram, call `ready()`, and serve until
        cancelled; then let the requests being taken finish (at most the grace period,
        after which they are cancelled, unanswered) and stop listening. The webhook stays
        set.

        Raises:
            ChannelRefused: the address cannot be listened on, or Telegram refused the
                webhook (a bad URL, a host it cannot resolve or reach).
            TelegramError: setWebhook failed for a reason that may pass (the network).
        """
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post(self._settings.served_path, self._receive)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=self._grace)
        await runner.setup()
        try:
            await self._listen(runner)
            await self._register()
            ready()
            await asyncio.get_running_loop().create_future()  # until cancelled
        finally:
            await runner.cleanup()
            await self._lanes.close()

    async def _listen(self, runner: web.AppRunner) -> None:
        host, port, path = self._settings.host, self._settings.port, self._settings.served_path
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as exc:
            raise ChannelRefused(
                f"channels.telegram.webhook.listen: cannot listen on {host}:{port} ({exc}); "
                "choose a free port (each gateway on one host needs its own)"
            ) from None
        if port == 0:  # the system picked one: say which
            port = next((a[1] for a in runner.addresses if isinstance(a, tuple)), port)
        logger.info("telegram webhook: taking updates on {}:{} at {}", host, port, path)

    async def _register(self) -> None:
        try:
            await self._bot.set_webhook(
                self._url,
                max_connections=self._settings.max_connections,
                allowed_updates=ALLOWED,
                drop_pending_updates=False,
                secret_token=self._secret.decode(),
            )
        except BadRequest as exc:  # a URL Telegram cannot use: it would refuse it again
            raise ChannelRefused(
                f"Telegram refused the webhook {self._url} ({exc.message}); check "
                "channels.telegram.webhook.url: a public https:// URL on port 443, 80, 88 or "
                "8443 that reaches this gateway"
            ) from None
        logger.info("telegram webhook set: Telegram posts updates to {}", self._url)

    async def _receive(self, request: web.Request) -> web.Response:
        """One update from Telegram: 200 once taken, else a status that has it sent again."""
        given = request.headers.get(SECRET_HEADER, "").encode()
        if not hmac.compare_digest(given, self._secret):
            self._refused(request, given)
            return web.Response(status=403, text="Forbidden")
        update = await self._parse(request)
        if update is None:
            return web.Response(status=400, text="Bad Request: not a Telegram update")
        try:
            taken = await self._lanes.run(lane(update), self._take(update))
        except (StoreError, Closed) as exc:  # the gate logged the outage; stopping
            logger.debug("telegram webhook: update {} left to Telegram: {}", update.update_id, exc)
            return _unavailable()
        except Exception as exc:  # noqa: BLE001 - Telegram sends it again; others go on
            logger.error(
                "telegram webhook: update {} could not be taken (Telegram sends it again): {}",
                update.update_id,
                exc,
            )
            return web.Response(status=500, text="Internal Server Error")
        if not taken:  # stopping, and not taken: the next start takes it
            return _unavailable()
        return web.Response(status=200)

    async def _parse(self, request: web.Request) -> Update | None:
        """The update the body holds; None (logged) when it holds none."""
        try:
            data = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError) as exc:
            logger.warning("telegram webhook: refused a body that is not JSON: {}", exc)
            return None
        if not isinstance(data, dict) or not isinstance(data.get("update_id"), int):
            logger.warning("telegram webhook: refused JSON that is no update (no update_id)")
            return None
        try:
            return Update.de_json(data, self._bot)
        except Exception as exc:  # noqa: BLE001 - PTB raises whatever the data makes Python raise
            logger.warning(
                "telegram webhook: refused update {}, which could not be read: {!r}",
                data["update_id"],
                exc,
            )
            return None

    def _refused(self, request: web.Request, given: bytes) -> None:
        """Log a refused request: at warning the first time from its source, then at debug."""
        source = request.remote or "unknown"
        if forwarded := request.headers.get("X-Forwarded-For"):
            source = f"{source} (for {forwarded.split(',')[0].strip()})"
        what = "a wrong secret token" if given else "no secret token"
        if source in self._warned or len(self._warned) >= WARNED_SOURCES:
            logger.debug("telegram webhook: refused a request from {} with {}", source, what)
            return
        self._warned.add(source)
        logger.warning(
            "telegram webhook: refused a request from {} with {} (not from Telegram, or "
            "channels.telegram.webhook.secret_token changed since the webhook was set); "
            "later ones from there are logged at debug",
            source,
            what,
        )


def _unavailable() -> web.Response:
    return web.Response(status=503, text="Service Unavailable", headers={"Retry-After": "5"})
