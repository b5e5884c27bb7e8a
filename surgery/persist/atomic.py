"""Writing a directory so that nothing is lost: a lock, a temporary sibling and a checked swap.

A save first takes the lock file ``.NAME.lock`` next to the output directory ``NAME`` (created with
``O_EXCL``, holding the writer's process id) and keeps it until the new directory is in place, so
the check "may the output be written?" and the final rename cannot interleave with another
writer's: of two writers to one path, exactly one succeeds and the other gets a one-line
:class:`~surgery.core.errors.OutputPathError`. A lock whose process is gone (killed) is taken over.

What may be replaced (:func:`output_problem`): a missing path or an empty directory, and with
``overwrite`` an earlier surgery output (it holds ``surgery.json``, ``compress.json``,
``surgery-onnx.json``, ``surgery-openvino.json`` or ``surgery-output.json`` as surgery writes
them); never the working directory, an ancestor of it, the home directory or ``/``, and never a
directory of someone else's files.

Temporaries are surgery's own: ``.NAME.tmp-<pid>-<8 hex>`` (the new directory being written, or the
previous output being deleted) and ``.NAME.old-<pid>-<8 hex>`` (the previous output during a swap
without an exchange rename). Only those exact names of writers whose process is dead are touched:
a ``tmp`` one is deleted, an ``old`` one, the previous output stranded by a killed swap, is renamed
back to ``NAME`` when ``NAME`` is missing and otherwise left alone; never deleted.

The replace itself is one ``renameat2(RENAME_EXCHANGE)`` where the system has it, else two renames
that restore the previous output on any exception; SIGINT and SIGTERM are deferred during the swap,
so a signal lands before it (nothing replaced) or after it (the new output complete).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import signal
import socket
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from surgery.core.errors import OutputPathError
from surgery.core.manifest import MANIFEST_NAME

#: The file a writer without a report of its own (``save_stock``) puts in its output directory, so
#: that a later ``--overwrite`` knows the directory is surgery's (transformers ignores it).
OUTPUT_MARK_NAME = "surgery-output.json"

_ONNX_INFO = "surgery-onnx.json"  # surgery.deploy.names.INFO_NAME (deploy is a higher layer than persist)
_OPENVINO_INFO = "surgery-openvino.json"  # surgery.deploy.openvino_export.OV_INFO


def _has(*keys: str) -> Callable[[dict[str, Any]], bool]:
    return lambda value: set(keys) <= value.keys()


#: Files that make a directory an earlier surgery output: name -> what its JSON object must hold.
#: A file of that name alone is not enough (a user's project may have its own ``compress.json``).
SURGERY_OUTPUT_FILES: dict[str, Callable[[dict[str, Any]], bool]] = {
    MANIFEST_NAME: lambda value: value.get("format") == "surgery",
    "compress.json": _has("target", "runtime", "reference", "candidates"),  # surgery.cli.compress.REPORT_NAME
    _ONNX_INFO: _has("onnx_bytes", "export_seconds"),
    f"onnx/{_ONNX_INFO}": _has("onnx_bytes", "export_seconds"),  # sentence-transformers export, compress
    _OPENVINO_INFO: _has("ir_bytes", "export_seconds"),
    f"openvino/{_OPENVINO_INFO}": _has("ir_bytes", "export_seconds"),
    OUTPUT_MARK_NAME: lambda value: value.get("format") == "surgery-output",
}
#: Largest marker file read: real ones are kilobytes (compress.json with its search path, tens of them).
_MAX_MARK_BYTES = 64 * 2**20

_SAVED: list[Path] = []


def saved_outputs() -> tuple[Path, ...]:
    """Every directory and file this process has put in place, oldest first (for an honest interrupt message).

    Example:
        >>> import tempfile
        >>> before = len(saved_outputs())
        >>> out = atomic_write(Path(tempfile.mkdtemp()) / "r.json", "{}")
        >>> saved_outputs()[before:] == (out,)
        True
    """
    return tuple(_SAVED)


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


def _existing_ancestor(path: Path) -> Path:
    parent = path
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent


def check_creatable(path: Path, label: str) -> None:
    """Refuse a path whose directories cannot be made or written: under a file, or in an unwritable directory.

    Nothing is created; the first existing ancestor decides (a directory, writable and searchable).

    Example:
        >>> import tempfile
        >>> a_file = Path(tempfile.mkstemp()[1])
        >>> check_creatable(a_file / "model", "--out")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.OutputPathError: --out .../model: ... is a file, so the directory cannot be created; ...
    """
    parent = _existing_ancestor(path.parent)
    if not parent.is_dir():
        raise OutputPathError(f"{label} {path}: {parent} is a file, so the directory cannot be created; choose "
                              "another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputPathError(f"{label} {path}: directory {parent} is not writable; choose another path")


def _json_object(file: Path) -> dict[str, Any] | None:
    try:
        if file.is_symlink() or not file.is_file() or file.stat().st_size > _MAX_MARK_BYTES:
            return None
        value = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def surgery_output_mark(directory: Path) -> str | None:
    """The file that shows ``directory`` is an earlier surgery output (e.g. ``surgery.json``), or None.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "surgery.json").write_text('{"notes": "mine"}')
        >>> surgery_output_mark(d) is None
        True
        >>> _ = (d / "surgery.json").write_text('{"format": "surgery", "steps": []}')
        >>> surgery_output_mark(d)
        'surgery.json'
    """
    for name, looks_right in SURGERY_OUTPUT_FILES.items():
        value = _json_object(directory / name)
        if value is not None and looks_right(value):
            return name
    return None


def write_output_mark(directory: Path, kind: str) -> Path:
    """Write :data:`OUTPUT_MARK_NAME` into an output being saved that has no manifest or report of its own.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = write_output_mark(d, "stock")
        >>> surgery_output_mark(d)
        'surgery-output.json'
    """
    file = directory / OUTPUT_MARK_NAME
    file.write_text(json.dumps({"format": "surgery-output", "kind": kind,
                                "note": "written by surgery; surgery --overwrite may replace this directory"},
                               indent=2) + "\n")
    return file


def _protected(target: Path) -> str | None:
    """Why ``target`` is never an output directory (the working or home directory, an ancestor of one), or None."""
    places = []
    with suppress(OSError):  # the working directory was deleted
        places.append(("the working directory", Path.cwd().resolve()))
    with suppress(RuntimeError, KeyError, OSError):  # no HOME and no passwd entry
        places.append(("your home directory", Path.home().resolve()))
    for what, place in places:
        if target == place:
            return f"is {what}"
    if target == Path(target.anchor):
        return "is /"
    for what, place in places:
        if target in place.parents:
            return f"contains {what} {place}"
    return None


def output_problem(out: str | os.PathLike[str], *, overwrite: bool, flag: str = "output directory") -> str | None:
    """Why ``out`` may not be written as an output directory (one line naming the fix), or None if it may.

    Allowed: a missing path (its directories can be made), an empty directory, and with ``overwrite``
    an earlier surgery output (:func:`surgery_output_mark`). Refused: a file, the working directory
    or an ancestor of it, the home directory or an ancestor of it, ``/``, and a directory holding
    files surgery did not write, even with ``overwrite``.

    Example:
        >>> import tempfile
        >>> mine = Path(tempfile.mkdtemp())
        >>> _ = (mine / "notes.txt").write_text("x")
        >>> output_problem(mine, overwrite=True, flag="--out")  # doctest: +ELLIPSIS
        '--out ... holds files surgery did not write (no surgery.json, ...); --overwrite replaces only ...'
        >>> output_problem(Path.home(), overwrite=True, flag="--out")  # doctest: +ELLIPSIS
        '--out ... is ... directory; the save replaces the whole directory, so name a new one ...'
        >>> output_problem(mine / "new", overwrite=False) is None
        True
    """
    target = Path(out).expanduser().resolve()
    where = _protected(target)
    if where is not None:
        return (f"{flag} {target} {where}; the save replaces the whole directory, so name a new one "
                f"(e.g. {target / 'surgery-out'})")
    if target.exists() and not target.is_dir():
        return f"{flag} {target} is a file; choose a directory path"
    if not target.exists():
        try:
            check_creatable(target, flag)
        except OutputPathError as exc:
            return str(exc)
        return None
    if not os.access(target.parent, os.W_OK | os.X_OK):
        return f"{flag} {target}: directory {target.parent} is not writable; choose another path"
    try:
        empty = not any(target.iterdir())
    except OSError as exc:
        return f"{flag} {target} cannot be read ({exc.strerror}); choose another directory"
    if empty:
        return None
    if surgery_output_mark(target) is None:
        marks = ", ".join(name for name in SURGERY_OUTPUT_FILES if "/" not in name)
        return (f"{flag} {target} holds files surgery did not write (no {marks}); --overwrite replaces only an "
                "empty directory or an earlier surgery output: choose a new directory, or move those files away")
    if not overwrite:
        return f"{flag} {target} exists and is not empty; pass --overwrite to replace it, or choose a new directory"
    return None


_TEMP = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>[0-9]+)-[0-9a-f]{8}")


def _temporary_name(out: Path, kind: str) -> Path:
    """A temporary sibling of ``out`` of the one form the clean-up recognizes (see :data:`_TEMP`)."""
    return out.parent / f".{out.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _leftovers(out: Path, kind: str, *, directories: bool = True) -> list[Path]:
    """Surgery's own temporaries of ``kind`` beside ``out`` whose writer process is dead, newest first.

    Directories (of :func:`atomic_directory`), or with ``directories=False`` files (of :func:`atomic_write`).
    """
    found: list[tuple[float, Path]] = []
    try:
        entries = list(out.parent.iterdir())
    except OSError:
        return []
    for entry in entries:
        match = _TEMP.fullmatch(entry.name)
        if (match is None or match["name"] != out.name or match["kind"] != kind or entry.is_symlink()
                or entry.is_dir() is not directories or not (entry.is_dir() or entry.is_file())
                or _pid_alive(int(match["pid"]))):
            continue
        with suppress(OSError):  # gone meanwhile
            found.append((entry.stat().st_mtime, entry))
    return [entry for _, entry in sorted(found, reverse=True)]


def restore_stranded(out: Path) -> Path | None:
    """Rename a previous output stranded by a killed swap (``.NAME.old-<pid>-*``) back to a missing ``out``.

    Needs the lock (see :func:`output_lock`). Returns the name it was restored from, or None.

    Example:
        >>> import subprocess, sys, tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
        >>> hidden = root / f".m.old-{int(dead.stdout)}-0123abcd"
        >>> hidden.mkdir()
        >>> restore_stranded(root / "m") == hidden, (root / "m").is_dir()
        (True, True)
    """
    if out.exists() or out.is_symlink():
        return None
    for stranded in _leftovers(out, "old"):  # newest first: the output of the latest swap
        try:
            os.rename(stranded, out)
        except OSError:
            continue
        return stranded
    return None


def prepare_output(out: str | os.PathLike[str], *, overwrite: bool, flag: str = "output directory") -> Path:
    """Check ``out`` before any work (:func:`output_problem`), after restoring a stranded previous output.

    Example:
        >>> import tempfile
        >>> prepare_output(Path(tempfile.mkdtemp()) / "m", overwrite=False).name
        'm'
    """
    target = Path(out).expanduser().resolve()
    restored = None
    if target.parent.is_dir() and not target.exists() and _leftovers(target, "old"):
        # A live writer holding the lock (another rank of the same job) restores it itself, under the lock.
        with suppress(OutputPathError), output_lock(target):
            restored = restore_stranded(target)
    problem = output_problem(target, overwrite=overwrite, flag=flag)
    if problem is not None:
        if restored is not None:
            problem = f"{problem} (it was restored from {restored.name}, left by an interrupted save)"
        raise OutputPathError(problem)
    return target


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
    problem = output_problem(out, overwrite=overwrite)
    if problem is not None:
        raise OutputPathError(problem)


@contextmanager
def atomic_directory(out_dir: str | os.PathLike[str], *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling directory that replaces ``out_dir`` only if the block succeeds.

    An interrupted or failing write leaves ``out_dir`` exactly as it was; a concurrent writer to the
    same path gets an :class:`~surgery.core.errors.OutputPathError` instead of replacing this one's result.
    ``overwrite`` replaces only an earlier surgery output (see :func:`output_problem`).

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
        # Holding the lock, no live writer owns a temporary directory of this path: those of dead
        # writers are leftovers, a previous output stranded by a killed swap is put back first.
        restore_stranded(out)
        for stale in _leftovers(out, "tmp"):
            shutil.rmtree(stale, ignore_errors=True)
        _check_target(out, overwrite)  # again, now that no other writer can change the answer
        tmp = _temporary_name(out, "tmp")
        tmp.mkdir()
        try:
            yield tmp
            _place(tmp, out, overwrite)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM that arrive during the block take effect when it ends, once each.

    Their handlers are swapped for one that only notes the signal, and the noted signals are raised
    again afterwards. Not ``pthread_sigmask``: a signal to the process is delivered to any thread that
    does not block it (torch keeps worker threads), and Python then runs its handler in the main
    thread anyway, in the middle of the swap. Outside the main thread no handler can interrupt the block.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    previous = {signum: signal.signal(signum, lambda number, frame: noted.append(number))
                for signum in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(signum) not in (signal.SIG_IGN, None)}  # an ignored signal stays ignored
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(noted):
            signal.raise_signal(signum)  # now the usual handler runs (or the default action ends the process)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _renameat2() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    except OSError:
        return None


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> _ = (root / "a").write_text("A"), (root / "b").write_text("B")
        >>> exchange(root / "a", root / "b") is False or (root / "a").read_text() == "B"
        True
    """
    func = _renameat2()
    if func is None:
        return False
    if func(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):  # a file system without exchange
        return False
    raise OSError(code, os.strerror(code), str(b))


def _created_meanwhile(out: Path, exc: OSError) -> OSError:
    if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
        return OutputPathError(f"output directory {out} was created by someone else during the save; "
                               "nothing was replaced, choose a new path or pass overwrite")
    return exc


def _place(tmp: Path, out: Path, overwrite: bool) -> None:
    with _signals_deferred():  # a signal lands before the swap (nothing replaced) or after it (all saved)
        if overwrite and out.exists():
            _check_target(out, overwrite)  # a lockless writer may have put its files there meanwhile
            if exchange(tmp, out):
                _SAVED.append(out)
                shutil.rmtree(tmp, ignore_errors=True)  # the previous output, now under the temporary name
                return
            old = _temporary_name(out, "old")
            os.rename(out, old)
            try:
                os.rename(tmp, out)
            except BaseException as exc:
                os.rename(old, out)
                if isinstance(exc, OSError):
                    raise _created_meanwhile(out, exc) from None
                raise
            _SAVED.append(out)
            # Deleted under a temporary name: a kill during the deletion leaves a tmp leftover, not an old one.
            os.rename(old, tmp)
            shutil.rmtree(tmp, ignore_errors=True)
            return
        try:
            # rename(2) replaces a missing path or an empty directory, and refuses a non-empty one.
            os.rename(tmp, out)
        except OSError as exc:
            raise _created_meanwhile(out, exc) from None
        _SAVED.append(out)


def atomic_write(path: str | os.PathLike[str], data: str | bytes, *, overwrite: bool = False) -> Path:
    """Write ``data`` to the file ``path`` so that a reader sees the old file or the whole new one, never a part.

    The bytes go to a temporary sibling first (``.NAME.tmp-<pid>-<8 hex>``, flushed to disk; one a
    killed writer left is removed, nothing else), which then takes
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
    for stale in _leftovers(out, "tmp", directories=False):  # of a killed writer of this file: its own name form
        stale.unlink(missing_ok=True)
    tmp = _temporary_name(out, "tmp")
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
    _SAVED.append(out)
    return out
