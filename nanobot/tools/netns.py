"""The network namespace sandboxed commands share with `tools.exec.network: public`.

One namespace, made once at start by a small long-lived holder process, joined by every
command (as root, started from a thread of the gateway inside it, `_launcher`; otherwise
`nsenter` in front of bubblewrap): making a namespace per command would cost more than the
whole rest of the sandbox. Inside there is only loopback, so nothing on the host's
own 127.0.0.1 (the store, the webhook port, Redis, abstract unix sockets: those belong to a
network namespace) can be reached. The holder creates a listening socket at 127.0.0.1:<port>
inside it and hands it to the gateway over a socketpair (SCM_RIGHTS): the egress proxy serves
that socket from the gateway's own event loop, and is the only way out.

As root the holder unshares the network namespace alone; otherwise a user namespace too
(mapping only its own uid), which commands join first (`nsenter --user ...
--preserve-credentials`). The holder dies with the gateway: it waits for EOF on a pipe only
the gateway holds (the kernel closes it however the gateway ends), and has
PR_SET_PDEATHSIG when started from the main thread (the signal follows the thread that
started it).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading

from nanobot.tools._launcher import Launcher

READY_TIMEOUT = 10.0
STOP_TIMEOUT = 2.0

# Runs with `python -I -S` (no site: a start of a few ms). argv: the socket's fd, whether to
# set PDEATHSIG. Errors go to stderr, which the gateway reads when no socket arrives.
_HOLDER = r"""
import ctypes, fcntl, os, socket, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
channel = socket.socket(fileno=int(sys.argv[1]))
if sys.argv[2] == "1":
    libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
uid, gid = os.geteuid(), os.getegid()
flags = 0x40000000 | (0 if uid == 0 else 0x10000000)  # CLONE_NEWNET [| CLONE_NEWUSER]
if libc.unshare(flags) != 0:
    sys.exit("unshare: " + os.strerror(ctypes.get_errno()))
if uid != 0:
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                       ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
with socket.socket() as s:
    name = struct.pack("16sH14x", b"lo", 0)
    got = struct.unpack("16sH14x", fcntl.ioctl(s, 0x8913, name))[1]  # SIOCGIFFLAGS
    fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", b"lo", got | 1))  # SIOCSIFFLAGS, IFF_UP
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(512)
socket.send_fds(channel, [b"ready"], [listener.fileno()])
listener.close()
channel.close()
while sys.stdin.buffer.read(4096):
    pass
"""


class NamespaceError(Exception):
    """The namespace could not be made; the message says why."""


class NetworkNamespace:
    """A network namespace held by a child process, and the egress listener inside it.

    `launcher`, as root, starts commands inside the namespace (see `_launcher`); otherwise
    `enter` is the argv prefix that runs a command in the namespace. It names the namespace
    by a descriptor the gateway holds (`/proc/<gateway>/fd/<n>`), not by the holder's pid:
    a pid the kernel gave to another process after the holder's end would lead a command
    into that process's network, the host's. The descriptors also keep the namespace alive
    should the holder die. `close()` ends the holder and closes them.
    """

    def __init__(self, holder: subprocess.Popen[bytes], listener: socket.socket) -> None:
        self._holder = holder
        self.listener = listener
        self.port: int = listener.getsockname()[1]
        # Opened while the holder is our unreaped child: its pid is still its own.
        kinds = ("net",) if os.geteuid() == 0 else ("user", "net")
        self._fds = {
            kind: os.open(f"/proc/{holder.pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
            for kind in kinds
        }
        # As root a thread of ours joins the namespace and starts the commands (no nsenter).
        self.launcher = Launcher(self._fds["net"]) if "user" not in self._fds else None
        ours = f"/proc/{os.getpid()}/fd"
        self.enter: list[str] = [_nsenter() or "nsenter"]
        if "user" in self._fds:
            self.enter += [f"--user={ours}/{self._fds['user']}", "--preserve-credentials"]
        self.enter.append(f"--net={ours}/{self._fds['net']}")

    @classmethod
    def create(cls) -> NetworkNamespace:
        """Start the holder and receive the listener. Blocking (some 20 ms).

        Raises:
            NamespaceError: nsenter is missing, or the holder could not make the namespace
                (no user namespaces here, say), with its reason.
        """
        if _nsenter() is None:
            raise NamespaceError("nsenter (util-linux) is not installed")
        ours, theirs = socket.socketpair()
        main = threading.current_thread() is threading.main_thread()
        try:
            holder = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _HOLDER, str(theirs.fileno()), str(int(main))],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=[theirs.fileno()],
                env={"PATH": "/usr/bin:/bin"},
            )
        except OSError as exc:
            ours.close()
            raise NamespaceError(f"the namespace holder could not start: {exc}") from None
        finally:
            theirs.close()
        with ours:
            ours.settimeout(READY_TIMEOUT)
            try:
                _, fds, _, _ = socket.recv_fds(ours, 16, 1)
            except OSError:
                fds = []
        if not fds:
            said = holder.stderr.read().decode(errors="replace") if holder.stderr else ""
            _stop(holder)
            raise NamespaceError(
                "a network namespace could not be made: "
                + (" ".join(said.split())[-300:] or f"exit code {holder.returncode}")
            )
        return cls(holder, socket.socket(fileno=fds[0]))

    @property
    def pid(self) -> int:
        return self._holder.pid

    def close(self) -> None:
        """End the holder (EOF on its pipe; SIGKILL after STOP_TIMEOUT) and close the
        listener and the namespace's descriptors. Blocking for at most STOP_TIMEOUT.
        Idempotent."""
        self.listener.close()
        if self.launcher is not None:
            self.launcher.close()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        _stop(self._holder)


def _nsenter() -> str | None:
    return shutil.which("nsenter") or shutil.which("nsenter", path="/usr/sbin:/usr/bin:/sbin:/bin")


def _stop(holder: subprocess.Popen[bytes]) -> None:
    if holder.stdin is not None and not holder.stdin.closed:
        holder.stdin.close()
    try:
        holder.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        holder.kill()
        holder.wait()
    if holder.stderr is not None:
        holder.stderr.close()
