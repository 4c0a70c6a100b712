"""Open-file limits of a started process: set before it execs, read from ``/proc``, or frozen.

:func:`limited` gives a ``preexec_fn`` that sets the child's soft and hard ``RLIMIT_NOFILE``;
with ``frozen`` it also installs a seccomp filter that answers EPERM to every later attempt to
change a limit (``setrlimit``, and ``prlimit64`` with a new value; reading stays allowed), as
some sandboxes do. :func:`open_file_limits` reads a process's limits as the kernel reports them.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import resource
from collections.abc import Callable
from pathlib import Path

import pytest

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_RET_ALLOW = 0x7FFF0000
_RET_EPERM = 0x00050000 | errno.EPERM
_LOAD = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
# (audit architecture, setrlimit, prlimit64) by machine
_SYSCALLS = {
    "x86_64": (0xC000003E, 160, 302),
    "aarch64": (0xC00000B7, 164, 261),
}


class _Filter(ctypes.Structure):
    _fields_ = (
        ("code", ctypes.c_ushort),
        ("jt", ctypes.c_ubyte),
        ("jf", ctypes.c_ubyte),
        ("k", ctypes.c_uint),
    )


class _Program(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter)))


def _program() -> list[tuple[int, int, int, int]]:
    """The filter: EPERM for setrlimit, and for prlimit64 given a new limit (its third argument)."""
    arch, setrlimit, prlimit64 = _SYSCALLS[platform.machine()]
    return [
        (_LOAD, 0, 0, 4),  # 0: seccomp_data.arch
        (_JEQ, 0, 7, arch),  # 1: another architecture: allow (9)
        (_LOAD, 0, 0, 0),  # 2: seccomp_data.nr
        (_JEQ, 6, 0, setrlimit),  # 3: refuse (10)
        (_JEQ, 0, 4, prlimit64),  # 4: any other call: allow (9)
        (_LOAD, 0, 0, 32),  # 5: args[2], its low word
        (_JEQ, 0, 3, 0),  # 6: a new limit given: refuse (10)
        (_LOAD, 0, 0, 36),  # 7: args[2], its high word
        (_JEQ, 0, 1, 0),  # 8: a new limit given: refuse (10)
        (_RET, 0, 0, _RET_ALLOW),  # 9
        (_RET, 0, 0, _RET_EPERM),  # 10
    ]


def _freeze_limits() -> None:
    """From now on this process (and what it execs) cannot change a resource limit: EPERM."""
    libc = ctypes.CDLL(None, use_errno=True)
    steps = _program()
    filters = (_Filter * len(steps))(*(_Filter(*step) for step in steps))
    program = _Program(len(steps), filters)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def require_seccomp() -> None:
    """Skip unless this machine's seccomp filter can be installed here (Linux, known CPU)."""
    if platform.system() != "Linux" or platform.machine() not in _SYSCALLS:
        pytest.skip("the limit-freezing filter is written for Linux on x86_64 or aarch64")


def limited(soft: int, hard: int, *, frozen: bool = False) -> Callable[[], None]:
    """A ``preexec_fn``: the child's open-file limits ``soft`` and ``hard``, ``frozen`` after."""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        if frozen:
            _freeze_limits()

    return apply


def open_file_limits(pid: int) -> tuple[int, int]:
    """The soft and hard open-file limits of process ``pid``, from ``/proc/PID/limits``."""
    for line in Path(f"/proc/{pid}/limits").read_text(encoding="utf-8").splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError(f"/proc/{pid}/limits has no 'Max open files' line")


def hard_limit_at_least(wanted: int) -> int:
    """``wanted``, when this process may give a child that hard limit; else the test is skipped."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"a hard open-file limit of {wanted} is needed; this process has {hard}")
    return wanted
