"""How the original nanobot reaches a fake Telegram: a proxy that plays api.telegram.org.

nanobot-ai 0.3.5's Telegram channel has no setting for the Bot API's URL (it leaves
python-telegram-bot at https://api.telegram.org), but it has ``proxy``: an HTTP proxy that
its httpx client asks to ``CONNECT api.telegram.org:443``. This proxy answers that, and only
that (anything else gets 403: nothing reaches the network), then terminates TLS itself with
a certificate for api.telegram.org signed by a CA made for this run with ``openssl``, which
the original trusts through ``SSL_CERT_FILE`` (httpx reads it), and relays the plaintext
HTTP to a FakeTelegram. The original's code runs unchanged; it pays one TLS session per
connection more than a client of the fake's plain HTTP, which is what it pays against
Telegram itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from bench._common import BenchError

HOST = "api.telegram.org"
_EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
_LEAF_EXTENSIONS = f"""\
subjectAltName=DNS:{HOST}
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
authorityKeyIdentifier=keyid,issuer
subjectKeyIdentifier=hash
"""


@dataclass(frozen=True)
class Certificates:
    """A throwaway CA (``ca_file``, to trust) and the certificate it signed for HOST."""

    ca_file: Path
    cert_file: Path
    key_file: Path

    @classmethod
    def make(cls, folder: Path) -> Self:
        """Write them into ``folder`` with openssl; BenchError if there is none or it fails."""
        openssl = shutil.which("openssl")
        if openssl is None:
            raise BenchError("no openssl to make the fake api.telegram.org's certificate")
        ca, ca_key = folder / "ca.pem", folder / "ca.key"
        cert, key, csr = folder / f"{HOST}.pem", folder / f"{HOST}.key", folder / "leaf.csr"
        extensions = folder / "leaf.ext"
        extensions.write_text(_LEAF_EXTENSIONS, encoding="utf-8")
        ca_subject = [
            "-subj",
            "/CN=nanobot bench CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
        ]
        ca_subject += ["-addext", "keyUsage=critical,keyCertSign,cRLSign"]
        signed_by_ca: list[str | Path] = [
            "-CA",
            ca,
            "-CAkey",
            ca_key,
            "-set_serial",
            "1",
            "-extfile",
            extensions,
        ]
        days = ["-days", "2"]
        commands: list[list[str | Path]] = [
            ["req", "-x509", *_EC_KEY, "-keyout", ca_key, "-out", ca, *days, *ca_subject],
            ["req", *_EC_KEY, "-keyout", key, "-out", csr, "-subj", f"/CN={HOST}"],
            ["x509", "-req", "-in", csr, "-out", cert, *days, *signed_by_ca],
        ]
        for command in commands:
            done = subprocess.run(
                [openssl, *map(str, command)], capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise BenchError(f"openssl {command[0]} failed: {done.stderr.strip()[-300:]}")
        return cls(ca, cert, key)


class TelegramTunnel:
    """``async with TelegramTunnel(certs, port)``: the proxy on 127.0.0.1, relaying to the
    fake Telegram at 127.0.0.1:``port``; ``url`` is the value of the original's ``proxy``."""

    def __init__(self, certs: Certificates, port: int) -> None:
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._context.load_cert_chain(certs.cert_file, certs.key_file)
        self._port = port
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.tunnels = 0  # CONNECTs relayed
        self.refused: list[str] = []  # request lines refused

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("TelegramTunnel is not started")
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._serve(reader, writer), name="telegram-tunnel")
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: asyncio.StreamWriter | None = None
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            line = head.split(b"\r\n", 1)[0].decode("latin-1")
            if not line.startswith(f"CONNECT {HOST}:443 "):
                self.refused.append(line)
                writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
                return
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await writer.start_tls(self._context)
            up_reader, upstream = await asyncio.open_connection("127.0.0.1", self._port)
            self.tunnels += 1
            await asyncio.gather(_relay(reader, upstream), _relay(up_reader, writer))
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
            pass  # the client went away: its connection ends, as with Telegram
        finally:
            for end in (writer, upstream):
                if end is not None:
                    end.close()


async def _relay(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy until ``source`` ends, then close ``sink``."""
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    except (OSError, ssl.SSLError):
        pass
    finally:
        with contextlib.suppress(OSError, ssl.SSLError):
            sink.close()
