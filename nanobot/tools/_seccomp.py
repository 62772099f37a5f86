"""A seccomp filter that takes the kernel keyring away from sandboxed commands.

The sandbox runs as nanobot's own user, and the user's and the session's keyrings follow a
process into new namespaces: a key added on the host (`keyctl add user k v @u`) would be
readable inside. The filter makes `add_key`, `request_key` and `keyctl` fail with EPERM
(request_key could also start the host's /sbin/request-key). bubblewrap loads it
(`--seccomp FD`) just before it runs the command.
"""

from __future__ import annotations

import platform
import struct

# (arch, syscall numbers of add_key, request_key, keyctl) per machine; x86_64 also serves
# i386 and x32 programs.
_KEYRING_SYSCALLS: dict[str, tuple[tuple[int, tuple[int, ...]], ...]] = {
    "x86_64": (
        (0xC000003E, (248, 249, 250, 0x40000000 + 248, 0x40000000 + 249, 0x40000000 + 250)),
        (0x40000003, (286, 287, 288)),
    ),
    "aarch64": ((0xC00000B7, (217, 218, 219)), (0x40000028, (309, 310, 311))),
}
_LD_W_ABS, _JEQ_K, _RET_K = 0x20, 0x15, 0x06
_RET_ALLOW, _RET_EPERM = 0x7FFF0000, 0x00050000 | 1
_INSN = struct.Struct("=HBBI")


def keyring_filter(machine: str | None = None) -> bytes | None:
    """The compiled BPF program for this machine's architecture, or None where nanobot has
    no syscall table for it (the keyring then stays reachable; `description` says so)."""
    table = _KEYRING_SYSCALLS.get(machine or platform.machine())
    if table is None:
        return None
    program: list[tuple[int, int, int, int]] = []
    for arch, numbers in table:
        # ld arch; jeq arch ? next : skip this block; ld nr; jeq nr ? deny : next ...
        block = [(_LD_W_ABS, 0, 0, 0)]
        block += [(_JEQ_K, 0, 0, n) for n in numbers]
        program.append((_LD_W_ABS, 0, 0, 4))
        program.append((_JEQ_K, 0, len(block), arch))
        program += block
    program.append((_RET_K, 0, 0, _RET_ALLOW))
    program.append((_RET_K, 0, 0, _RET_EPERM))
    deny = len(program) - 1
    fixed = []
    for index, (code, jt, jf, k) in enumerate(program):
        number = code == _JEQ_K and program[index - 1] != (_LD_W_ABS, 0, 0, 4)
        # A syscall number matched: jump to the deny.
        fixed.append(_INSN.pack(code, deny - index - 1 if number else jt, jf, k))
    return b"".join(fixed)
