"""Writing a directory so that nothing is lost: a lock, a temporary sibling and a checked rename.

A save first takes the lock file ``.NAME.lock`` next to the output directory ``NAME`` (created with
``O_EXCL``, holding the writer's process id) and keeps it until the new directory is in place, so
the check "is the output new or empty?" and the final rename cannot interleave with another
writer's: of two writers to one path, exactly one succeeds and the other gets a one-line
:class:`~surgery.core.errors.OutputPathError`. A lock whose process is gone (killed) is taken over, and
the temporary directories that process left behind (``.NAME.tmp-*``, ``.NAME.old-*``) are removed.
Without ``overwrite`` the new directory is renamed only onto a path that does not exist or is an
empty directory (``rename(2)`` itself refuses a non-empty one), so it never replaces a result.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from surgery.core.errors import OutputPathError


def check_separate(source: str | os.PathLike[str], out: str | os.PathLike[str], *, flag: str = "output") -> Path:
    """Refuse an output path equal to, inside, or containing ``source`` (symlinks resolved).

    Example:
        >>> import tempfile
        >>> src = Path(tempfile.mkdtemp())
        >>> check_separate(src, src / "sub")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.OutputPathError: output ... is inside the input model directory ...; choose a directory ...
    """
    target = Path(out).expanduser().resolve()
    origin = Path(source).expanduser().resolve()
    if target == origin:
        raise OutputPathError(f"{flag} {target} is the input model directory; choose another directory")
    if target in origin.parents:
        raise OutputPathError(f"{flag} {target} contains the input model directory {origin}; writing there would "
                              "replace the input, choose another directory")
    if origin in target.parents:
        raise OutputPathError(f"{flag} {target} is inside the input model directory {origin}; choose a directory "
                              "outside it")
    return target


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _lock_owner(lock: Path) -> tuple[str, int] | None:
    """(host, pid) written in a lock file, or None if it cannot be read."""
    try:
        host, _, pid = lock.read_text().strip().partition(":")
        return host, int(pid)
    except (OSError, ValueError):
        return None


def _leftovers(out: Path) -> list[Path]:
    return sorted(p for pattern in (f".{out.name}.tmp-*", f".{out.name}.old-*") for p in out.parent.glob(pattern))


@contextmanager
def output_lock(out: Path) -> Iterator[Path]:
    """Hold ``.NAME.lock`` beside ``out`` for the block; a lock of a dead process is taken over."""
    lock = out.parent / f".{out.name}.lock"
    stamp = f"{socket.gethostname()}:{os.getpid()}"
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            owner = _lock_owner(lock)
            if owner is not None and owner[0] == socket.gethostname() and not _pid_alive(owner[1]):
                lock.unlink(missing_ok=True)  # its writer was killed: take over
                continue
            who = f"process {owner[1]} on {owner[0]}" if owner else "another process"
            raise OutputPathError(
                f"{out} is being written by {who} (lock file {lock}); wait for it to finish, or delete the lock "
                "file if that process is gone"
            ) from None
        with os.fdopen(fd, "w") as handle:
            handle.write(stamp)
        break
    else:
        raise OutputPathError(f"cannot take the lock file {lock}; another writer keeps replacing it, try again")
    try:
        yield lock
    finally:
        if _lock_owner(lock) == (socket.gethostname(), os.getpid()):
            lock.unlink(missing_ok=True)


def _check_target(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise OutputPathError(f"output path {out} exists and is a file; choose a directory path")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise OutputPathError(f"output directory {out} exists and is not empty; choose a new path or pass overwrite")


@contextmanager
def atomic_directory(out_dir: str | os.PathLike[str], *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling directory that replaces ``out_dir`` only if the block succeeds.

    An interrupted or failing write leaves ``out_dir`` exactly as it was; a concurrent writer to the
    same path gets an :class:`~surgery.core.errors.OutputPathError` instead of replacing this one's result.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> with atomic_directory(root / "model") as tmp:
        ...     _ = (tmp / "a.txt").write_text("x")
        >>> (root / "model" / "a.txt").read_text(), sorted(p.name for p in root.iterdir())
        ('x', ['model'])
    """
    out = Path(out_dir).expanduser().resolve()
    _check_target(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(out):
        # Holding the lock, no live writer owns a temporary directory of this path: any is a leftover.
        for stale in _leftovers(out):
            shutil.rmtree(stale, ignore_errors=True)
        _check_target(out, overwrite)  # again, now that no other writer can change the answer
        tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            yield tmp
            _place(tmp, out, overwrite)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


def _place(tmp: Path, out: Path, overwrite: bool) -> None:
    old = None
    if overwrite and out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.rename(out, old)
    try:
        # rename(2) replaces a missing path or an empty directory, and refuses a non-empty one.
        os.rename(tmp, out)
    except OSError as exc:
        if old is not None:
            os.rename(old, out)
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise OutputPathError(f"output directory {out} was created by someone else during the save; "
                                  "nothing was replaced, choose a new path or pass overwrite") from None
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def atomic_write(path: str | os.PathLike[str], data: str | bytes, *, overwrite: bool = False) -> Path:
    """Write ``data`` to the file ``path`` so that a reader sees the old file or the whole new one, never a part.

    The bytes go to a temporary sibling first (``.NAME.tmp-*``, flushed to disk), which then takes
    the name: with ``overwrite`` by ``rename(2)``, which replaces atomically; without it by
    ``link(2)``, which fails if the name exists, so a file that appeared meanwhile is never replaced.

    Example:
        >>> import tempfile
        >>> f = Path(tempfile.mkdtemp()) / "report.json"
        >>> atomic_write(f, "{}\\n").read_text()
        '{}\\n'
        >>> atomic_write(f, "[]")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.OutputPathError: .../report.json exists; pass --overwrite to replace it, ...
        >>> atomic_write(f, "[]", overwrite=True).read_text()
        '[]'
    """
    out = Path(path).expanduser().absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    payload = data.encode() if isinstance(data, str) else data
    try:
        with tmp.open("xb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        if overwrite:
            if out.is_dir():
                raise OutputPathError(f"{out} is a directory; pass a file path")
            os.replace(tmp, out)
        else:
            try:
                os.link(tmp, out)
            except FileExistsError:
                raise OutputPathError(f"{out} exists; pass --overwrite to replace it, or choose a new file") from None
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                    raise
                # A file system without hard links: O_EXCL still never replaces a file, though a reader
                # could see it half-written.
                try:
                    with out.open("xb") as handle:
                        handle.write(payload)
                except FileExistsError:
                    raise OutputPathError(f"{out} exists; pass --overwrite to replace it, or choose a new "
                                          "file") from None
    finally:
        tmp.unlink(missing_ok=True)
    return out
