"""One writer per folder: an OS lock (flock) on a hidden file beside the folder being written.

`folder_lock(folder)` holds ``<parent>/.<name>.lock`` for as long as the `with` block runs, and removes it after. A
second process that asks for the same folder is refused at once with a `FolderBusy` naming the holder (its PID, host
and command line, which the holder writes into the lock file). The kernel drops the lock when the holder's process
ends, however it ends, so a killed run never leaves a stale lock behind: its file stays, but no one holds it, and the
next writer simply takes it. The lock file lives beside the folder rather than inside it, so it can be taken before the
folder exists and survives the folder being renamed into place.

flock locks are advisory and per open file: they work on local disks and on most network file systems that support
them; on a file system without locks (the call fails with ENOLCK / EOPNOTSUPP) the folder is written unlocked.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

from rpt.utils import UserError

try:
    import fcntl
except ImportError:  # not POSIX: no locking
    fcntl = None  # type: ignore[assignment]


class FolderBusy(UserError):
    """Another live process is writing the folder."""


def lock_path(folder: str | Path) -> Path:
    folder = Path(folder)
    return folder.parent / f".{folder.name}.lock"


def _holder_text(lock: Path) -> str:
    """"process PID on host HOST (COMMAND)" from what the holder wrote, as far as it can be read."""
    try:
        info = json.loads(lock.read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    if not isinstance(info, dict) or "pid" not in info:
        return "another process"
    command = f" ({info['command']})" if info.get("command") else ""
    return f"process {info['pid']} on host {info.get('host', '?')}{command}"


def _command_line() -> str:
    argv = list(sys.argv)
    if argv and Path(argv[0]).name in ("rpt", "__main__.py"):
        argv[0] = "rpt"
    text = " ".join(argv)
    return text if len(text) <= 200 else text[:197] + "..."


@contextlib.contextmanager
def folder_lock(folder: str | Path, action: str = "written") -> Iterator[Path]:
    """Hold the lock of `folder` (created beside it) for the `with` block, or raise FolderBusy naming the holder.

    action: what the holder does to the folder, for the message ("written", "built", "labelled").
    """
    folder = Path(folder)
    if fcntl is None:
        yield folder
        return
    lock = lock_path(folder)
    lock.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                yield folder  # no locks on this file system
                return
            raise FolderBusy(f"{folder} is being {action} by {_holder_text(lock)}; wait for it or stop it") from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed that file as it let go: take the lock on the one the path names now
    try:
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": _command_line()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        yield folder
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)  # while still held: a process that opened it meanwhile sees it gone and starts over
        os.close(fd)  # closing the last descriptor releases the lock
