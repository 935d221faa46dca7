"""An exclusive lock on a path, held by one process, that also works on a shared (cluster) filesystem.

The lock is a file created with ``O_CREAT | O_EXCL`` (atomic on local filesystems and NFSv3+) holding
``{"pid", "host", "time"}`` of its holder. A lock whose holder is on this host and no longer alive is
stale and taken over; a holder on another host cannot be checked from here, so its lock is only
reported (with the file to delete when the user knows that job is gone).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from types import TracebackType

from csd.errors import LockHeldError


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def lock_holder(path: Path) -> str | None:
    """``pid <pid> on host <host>`` of the process that may hold the lock file ``path``; None when there is
    no lock or it is stale (it names a process on this host that no longer exists). A holder on another host
    cannot be checked from here, and a lock naming no holder may be one being written: both count as held."""
    try:
        text = path.read_text()
    except OSError:
        return None
    try:
        holder = json.loads(text)
        pid, host = int(holder["pid"]), str(holder["host"])
    except (ValueError, KeyError, TypeError):
        return "a process that has not yet written its name"
    return None if host == socket.gethostname() and not pid_alive(pid) else f"pid {pid} on host {host}"


class FileLock:
    """``with FileLock(path):`` holds ``path`` exclusively; released (the file removed) on exit.

    ``what`` names the locked thing in the error message (e.g. the run directory).
    """

    def __init__(self, path: str | Path, what: str | None = None) -> None:
        self.path = Path(path)
        self.what = what or str(self.path)
        self.owner = {"pid": os.getpid(), "host": socket.gethostname()}
        self._content = b""

    def acquire(self) -> None:
        """Take the lock, taking over a stale one; raise :class:`LockHeldError` if a live holder has it."""
        while True:
            content = json.dumps({**self.owner, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode()
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._check_holder()
                continue
            with os.fdopen(fd, "wb") as f:
                f.write(content)
                f.flush()
                os.fsync(f.fileno())
            self._content = content
            return

    def _check_holder(self) -> None:
        """Return if the existing lock is gone or was stale (and removed); raise if its holder may be alive."""
        try:
            stale = self.path.read_bytes()
        except FileNotFoundError:
            return  # released meanwhile
        try:
            holder = json.loads(stale)
            pid, host = int(holder["pid"]), str(holder["host"])
        except (ValueError, KeyError, TypeError):  # half-written by a holder that is starting now
            time.sleep(0.05)
            if self.path.exists() and self.path.read_bytes() == stale:
                raise LockHeldError(
                    f"{self.what} is locked by {self.path}, which names no holder; delete it if no process uses {self.what}"
                ) from None
            return
        if host == self.owner["host"] and not pid_alive(pid):
            self._remove_if_unchanged(stale)
            return
        raise LockHeldError(
            f"{self.what} is in use by pid {pid} on host {host} (lock {self.path}, since {holder.get('time')}); "
            f"wait for it, or delete {self.path} if you know that process is gone"
        )

    def _remove_if_unchanged(self, stale: bytes) -> None:
        """Remove the lock file only if it still holds ``stale``: renaming is atomic, so of several processes
        taking over the same stale lock one removes it; a fresh lock renamed by mistake is linked back."""
        aside = self.path.with_name(f"{self.path.name}.{os.getpid()}.stale")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        if aside.read_bytes() != stale:
            with contextlib.suppress(FileExistsError):
                os.link(aside, self.path)
        aside.unlink()

    def release(self) -> None:
        """Remove the lock file if it is still ours."""
        with contextlib.suppress(FileNotFoundError):
            if self._content and self.path.read_bytes() == self._content:
                self.path.unlink()
        self._content = b""

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()
