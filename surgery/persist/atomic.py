"""Writing outputs so that nothing is lost: a lock, a temporary sibling, a manifest and a checked swap.

A save first takes the lock file ``.NAME.lock`` next to the output ``NAME`` (created with ``O_EXCL``,
holding the writer's host, process id and a random token) and keeps it until the new output is in
place, so the check "may the output be written?" and the final rename cannot interleave with another
writer's: of two writers to one path, exactly one succeeds and the other gets a one-line
:class:`~surgery.core.errors.OutputPathError`. A lock whose process is gone (killed) is taken over.

What may be replaced (:func:`output_problem`, the one rule of every command that takes ``--out``):
a missing path or an empty directory, and with ``overwrite`` a directory surgery wrote whole. Every
directory surgery writes carries at its root :data:`OUTPUT_MANIFEST`, written last before the
directory takes its name: the relative path of each entry, and for a file its size and SHA-256.
``overwrite`` replaces a non-empty directory only when that manifest is a regular file and the
directory holds exactly the entries it lists, unchanged and with no links: a report copied in, a
marker in a subfolder or a file the user added is refused in one line naming it. Never the working
directory, an ancestor of it, any user's home directory or an ancestor of one, or ``/``, whatever
they hold. A result file (``bench --json``, ``--report``, ``plot``'s PNGs) is replaced only when the
record surgery wrote beside it (:func:`file_record`) matches it (:func:`file_problem`).

Temporaries are surgery's own: ``.NAME.tmp-<pid>-<token>`` (the new output being written, or the
previous one being deleted) and ``.NAME.old-<pid>-<token>`` (the previous output during a swap
without an exchange rename). A leftover is removed only when the lock file of its dead writer names
it (same process id and token) and, for a directory, it holds the writer's ownership record with that
token or is a whole surgery output by its manifest; a name of that form alone is not proof, and
nothing else is touched. An ``old`` one, the previous output stranded by a killed swap, is renamed
back to ``NAME`` when ``NAME`` is missing (it is checked by its manifest) and never deleted.

The replace itself is one ``renameat2(RENAME_EXCHANGE)`` where the system has it, else two renames
that restore the previous output on any exception; SIGINT and SIGTERM are deferred during the swap,
so a signal lands before it (nothing replaced) or after it (the new output complete).
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import stat
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, NamedTuple

from surgery.core.errors import OutputPathError

#: At the root of every directory surgery writes, written last: every entry with its size and SHA-256.
OUTPUT_MANIFEST = ".surgery-manifest.json"
_MANIFEST_FORMAT = "surgery-output-manifest"
#: Inside a directory being written: the token of its writer's lock (removed before the directory takes its name).
_OWNER_NAME = ".surgery-writing"
_RECORD_FORMAT = "surgery-file-record"
#: Largest manifest or file record read (a manifest lists a few lines per file).
_MAX_RECORD_BYTES = 64 * 2**20
#: How long a file write waits for another process writing the same file (a file is written in moments).
_FILE_LOCK_WAIT = 30.0
#: The release whose outputs first carry a manifest (older ones are refused: nothing proves they are surgery's).
_MANIFEST_SINCE = "0.2"

_SAVED: list[Path] = []
_WRITING: set[Path] = set()  # temporary directories of atomic_directory being written by this process


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


def _entries(directory: Path, prefix: str = "") -> Iterator[tuple[str, os.stat_result]]:
    """Every entry under ``directory`` as (relative POSIX path, lstat), sorted, each directory before its contents.

    Links are reported, never followed.
    """
    with os.scandir(directory) as found:
        items = sorted(found, key=lambda item: item.name)
    for item in items:
        relative = f"{prefix}{item.name}"
        info = item.stat(follow_symlinks=False)
        yield relative, info
        if stat.S_ISDIR(info.st_mode):
            yield from _entries(Path(item.path), f"{relative}/")


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        while chunk := handle.read(2**20):
            digest.update(chunk)
    return digest.hexdigest()


def write_output_manifest(directory: Path) -> Path:
    """Write :data:`OUTPUT_MANIFEST` at the root of ``directory``: every entry it holds, files with size and SHA-256.

    :func:`atomic_directory` calls it last, just before the directory takes its name; a manifest
    already there (copied in with an artefact) is replaced.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "a.txt").write_text("x")
        >>> [e["path"] for e in json.loads(write_output_manifest(d).read_text())["entries"]]
        ['a.txt']
        >>> output_manifest_problem(d) is None
        True
    """
    entries: list[dict[str, Any]] = []
    for relative, info in _entries(directory):
        if relative in (OUTPUT_MANIFEST, _OWNER_NAME):
            continue
        if stat.S_ISDIR(info.st_mode):
            entries.append({"path": relative, "type": "dir"})
        elif stat.S_ISREG(info.st_mode):
            entries.append({"path": relative, "type": "file", "size": info.st_size,
                            "sha256": _sha256(directory / relative)})
        else:  # a writer's bug: an output surgery vouches for holds plain files and directories only
            raise OutputPathError(f"{directory / relative} is a link or a special file; an output of surgery holds "
                                  "only files and directories")
    file = directory / OUTPUT_MANIFEST
    file.unlink(missing_ok=True)
    file.write_text(json.dumps({"format": _MANIFEST_FORMAT, "version": 1,
                                "note": "written by surgery: every entry of this directory; surgery --overwrite "
                                        "replaces the directory only while it holds exactly these",
                                "entries": entries}, indent=1) + "\n")
    return file


def _regular_json(file: Path) -> Any:
    """The JSON in ``file`` if it is a regular file (not a link) of a sane size; raises ValueError otherwise."""
    info = os.lstat(file)  # FileNotFoundError: absent
    if not stat.S_ISREG(info.st_mode):
        raise ValueError("a link" if stat.S_ISLNK(info.st_mode) else "not a regular file")
    if info.st_size > _MAX_RECORD_BYTES:
        raise ValueError("too large")
    try:
        fd = os.open(file, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as handle:
            return json.loads(handle.read(_MAX_RECORD_BYTES + 1).decode("utf-8"))
    except (OSError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError("not readable JSON") from exc


_HEX64 = re.compile(r"[0-9a-f]{64}")


def _listed(directory: Path) -> dict[str, dict[str, Any]] | None:
    """The entries of ``directory``'s manifest by path; None if it has none; ValueError if surgery did not write it."""
    try:
        value = _regular_json(directory / OUTPUT_MANIFEST)
    except FileNotFoundError:
        return None
    if not isinstance(value, dict) or value.get("format") != _MANIFEST_FORMAT or not isinstance(
            value.get("entries"), list):
        raise ValueError(f"not a manifest of format {_MANIFEST_FORMAT}")
    listed: dict[str, dict[str, Any]] = {}
    for entry in value["entries"]:
        path = entry.get("path") if isinstance(entry, dict) else None
        good = (isinstance(path, str) and path not in listed and path != OUTPUT_MANIFEST
                and all(part not in ("", ".", "..") for part in path.split("/")) and "\\" not in path
                and "\0" not in path and (entry.get("type") == "dir" or (
                    entry.get("type") == "file" and type(entry.get("size")) is int and entry["size"] >= 0
                    and isinstance(entry.get("sha256"), str) and _HEX64.fullmatch(entry["sha256"]) is not None)))
        if not good:
            raise ValueError("an entry that is not a relative path with its type, size and digest")
        listed[path] = entry
    return listed


def _first_file(directory: Path, found: list[tuple[str, os.stat_result]]) -> Path:
    """The entry to name for a directory without a manifest: a regular file at its root if it has one."""
    top = [(relative, info.st_mode) for relative, info in found if "/" not in relative]
    files = [relative for relative, mode in top if stat.S_ISREG(mode)]
    return directory / (files or [relative for relative, _ in top])[0]


def output_manifest_problem(directory: Path) -> str | None:
    """What in ``directory`` is not surgery's (one clause naming the entry), or None if surgery wrote it whole.

    Whole means: :data:`OUTPUT_MANIFEST` at the root is a regular file surgery wrote, and the
    directory holds exactly the entries it lists (no more, no fewer, no links), each file with its
    recorded size and SHA-256.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "model.bin").write_text("w")
        >>> _ = write_output_manifest(d)
        >>> _ = (d / "eval-notes.txt").write_text("mine")
        >>> output_manifest_problem(d)  # doctest: +ELLIPSIS
        '.../eval-notes.txt is not a file surgery wrote'
    """
    try:
        found = list(_entries(directory))
    except (OSError, RecursionError) as exc:
        return f"{directory} cannot be read whole ({getattr(exc, 'strerror', None) or type(exc).__name__})"
    try:
        listed = _listed(directory)
    except ValueError as exc:
        return f"{directory / OUTPUT_MANIFEST} is not a manifest surgery wrote ({exc})"
    if listed is None:
        if not found:
            return f"{directory} has no {OUTPUT_MANIFEST}"
        return f"{_first_file(directory, found)} is not a file surgery wrote: no {OUTPUT_MANIFEST} there lists it"
    seen = set()
    for relative, info in found:
        if relative == OUTPUT_MANIFEST:
            continue
        path, entry = directory / relative, listed.get(relative)
        if stat.S_ISLNK(info.st_mode):
            return f"{path} is a link, not a file surgery wrote"
        if entry is None or not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
            return f"{path} is not a file surgery wrote"
        seen.add(relative)
        kind = "dir" if stat.S_ISDIR(info.st_mode) else "file"
        if entry["type"] != kind or (kind == "file" and (info.st_size != entry["size"]
                                                         or _sha256(path) != entry["sha256"])):
            return f"{path} was changed after surgery wrote it"
    missing = sorted(set(listed) - seen)
    if missing:
        return f"{directory / missing[0]} is listed in its {OUTPUT_MANIFEST} but missing"
    return None


def file_record(path: str | os.PathLike[str]) -> Path:
    """The record surgery writes beside a result file it wrote (``.NAME.surgery-record.json``: size and SHA-256).

    Example:
        >>> file_record("/tmp/r.json").name
        '.r.json.surgery-record.json'
    """
    file = Path(path)
    return file.parent / f".{file.name}.surgery-record.json"


def _record_problem(file: Path) -> str | None:
    """Why ``file`` is not a result file surgery wrote as it stands (one clause), or None."""
    record = file_record(file)
    info = os.lstat(file)
    if stat.S_ISLNK(info.st_mode):
        return "is a link, not a file surgery wrote"
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    try:
        value = _regular_json(record)
    except FileNotFoundError:
        return (f"is not a file surgery wrote (no {record.name} beside it; a file of surgery before "
                f"{_MANIFEST_SINCE} has none: if it is one, delete it by hand)")
    except ValueError as exc:
        return f"is not a file surgery wrote ({record.name} beside it is {exc})"
    if not isinstance(value, dict) or value.get("format") != _RECORD_FORMAT or value.get("name") != file.name:
        return f"is not a file surgery wrote ({record.name} beside it is not surgery's record of it)"
    if value.get("size") != info.st_size or value.get("sha256") != _sha256(file):
        return f"was changed after surgery wrote it (it no longer matches {record.name})"
    return None


def file_problem(path: str | os.PathLike[str], *, overwrite: bool, flag: str = "", recorded: bool = True
                 ) -> str | None:
    """Why the result file ``path`` may not be written (one line naming the fix), or None if it may.

    A missing path may be written; an existing file only with ``overwrite``, and then only when
    surgery's record beside it (:func:`file_record`) matches it: a file of the user's, one changed
    since, or a link is refused. ``recorded=False`` is for surgery's own cache files, which carry no
    record (any file at their path is replaced).

    Example:
        >>> import tempfile
        >>> mine = Path(tempfile.mkdtemp()) / "r.json"
        >>> _ = mine.write_text("my results")
        >>> file_problem(mine, overwrite=True, flag="--json")  # doctest: +ELLIPSIS
        '--json .../r.json is not a file surgery wrote (no .r.json.surgery-record.json beside it; ...'
        >>> mine.unlink(); _ = atomic_write(mine, "{}")
        >>> file_problem(mine, overwrite=True) is None
        True
    """
    file = Path(path).expanduser().absolute()
    label = f"{flag} {file}" if flag else str(file)
    try:
        info = os.lstat(file)
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(info.st_mode):
        return f"{label} is a directory; pass a file path such as {file / 'report.json'}"
    if not overwrite:
        return f"{label} exists; pass --overwrite to replace it, or choose a new file"
    if not recorded:
        return None
    why = _record_problem(file)
    if why is None:
        return None
    return f"{label} {why}; --overwrite replaces only a file surgery wrote: move it away or choose another file"


def _homes() -> list[tuple[str, Path]]:
    """Every user's home directory (the passwd database, and ``$HOME``), each with how to name it."""
    places = []
    with suppress(RuntimeError, KeyError, OSError):  # no HOME and no passwd entry
        places.append(("your home directory", Path.home().resolve()))
    try:
        import pwd
    except ImportError:  # not a POSIX system
        return places
    with suppress(OSError):
        for user in pwd.getpwall():
            if user.pw_dir:
                places.append((f"the home directory of user {user.pw_name}", Path(user.pw_dir).resolve()))
    return places


def _protected(target: Path) -> str | None:
    """Why ``target`` is never an output directory (``/``, the working directory, a home directory, an ancestor
    of one), or None."""
    if target == Path(target.anchor):
        return "is /"
    places = []
    with suppress(OSError):  # the working directory was deleted
        places.append(("the working directory", Path.cwd().resolve()))
    places.extend(_homes())
    for what, place in places:
        if target == place:
            return f"is {what}"
    for what, place in places:
        if target in place.parents:
            return f"contains {what} {place}"
    return None


def output_problem(out: str | os.PathLike[str], *, overwrite: bool, flag: str = "output directory") -> str | None:
    """Why ``out`` may not be written as an output directory (one line naming the fix), or None if it may.

    Allowed: a missing path (its directories can be made), an empty directory, and with ``overwrite``
    a directory surgery wrote whole (:func:`output_manifest_problem`). Refused: a file, ``/``, the
    working directory or an ancestor of it, any user's home directory or an ancestor of one (whatever
    they hold), and a directory holding anything surgery's manifest does not list, even with ``overwrite``.

    Example:
        >>> import tempfile
        >>> mine = Path(tempfile.mkdtemp())
        >>> _ = (mine / "notes.txt").write_text("x")
        >>> output_problem(mine, overwrite=True, flag="--out")  # doctest: +ELLIPSIS
        '--out ... holds files surgery did not write (.../notes.txt is not a file surgery wrote: no ...); ...'
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
    why = output_manifest_problem(target)
    if why is not None:
        older = "" if os.path.lexists(target / OUTPUT_MANIFEST) else (
            f" (an output of surgery before {_MANIFEST_SINCE} has no manifest, so nothing proves surgery wrote it: "
            "delete it by hand if it is one)")
        return (f"{flag} {target} holds files surgery did not write ({why}); --overwrite replaces only an empty "
                f"directory or one surgery wrote whole: move it away, or choose another {flag}{older}")
    if not overwrite:
        return f"{flag} {target} exists and is not empty; pass --overwrite to replace it, or choose a new directory"
    return None


_TEMP = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>[0-9]+)-(?P<token>[0-9a-f]{8})")


def _temporary_name(out: Path, kind: str, token: str) -> Path:
    """The temporary sibling of ``out`` of ``kind`` (tmp, old) that the lock with ``token`` names."""
    return out.parent / f".{out.name}.{kind}-{os.getpid()}-{token}"


def _whole_or_empty(directory: Path) -> bool:
    """Whether ``directory`` is empty or an output surgery wrote whole (its manifest says so)."""
    try:
        return not any(directory.iterdir()) or output_manifest_problem(directory) is None
    except OSError:
        return False


def _stranded(out: Path) -> list[Path]:
    """Previous outputs of ``out`` stranded by a killed swap (``.NAME.old-<dead pid>-*``), newest first.

    Only a directory that is empty or surgery's whole output by its manifest counts: the name is not proof.
    """
    found: list[tuple[float, Path]] = []
    try:
        entries = list(out.parent.iterdir())
    except OSError:
        return []
    for entry in entries:
        match = _TEMP.fullmatch(entry.name)
        if (match is None or match["name"] != out.name or match["kind"] != "old" or entry.is_symlink()
                or not entry.is_dir() or _pid_alive(int(match["pid"])) or not _whole_or_empty(entry)):
            continue
        with suppress(OSError):  # gone meanwhile
            found.append((entry.stat().st_mtime, entry))
    return [entry for _, entry in sorted(found, reverse=True)]


def restore_stranded(out: Path) -> Path | None:
    """Rename a previous output stranded by a killed swap (``.NAME.old-<pid>-*``) back to a missing ``out``.

    Needs the lock (see :func:`output_lock`). Only a directory surgery wrote whole (or an empty one)
    is restored; it is never deleted. Returns the name it was restored from, or None.

    Example:
        >>> import subprocess, sys, tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
        >>> hidden = root / f".m.old-{int(dead.stdout)}-0123abcd"
        >>> hidden.mkdir(); _ = (hidden / "config.json").write_text("{}"); _ = write_output_manifest(hidden)
        >>> restore_stranded(root / "m") == hidden, (root / "m" / "config.json").is_file()
        (True, True)
    """
    if out.exists() or out.is_symlink():
        return None
    for stranded in _stranded(out):  # newest first: the output of the latest swap
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
    if target.parent.is_dir() and not target.exists() and _stranded(target):
        # A live writer holding the lock (another rank of the same job) restores it itself, under the lock.
        with suppress(OutputPathError), output_lock(target):
            restored = restore_stranded(target)
    problem = output_problem(target, overwrite=overwrite, flag=flag)
    if problem is not None:
        if restored is not None:
            problem = f"{problem} (it was restored from {restored.name}, left by an interrupted save)"
        raise OutputPathError(problem)
    return target


class _Owner(NamedTuple):
    host: str
    pid: int
    token: str  # empty in a lock of surgery before 0.2


def _lock_owner(lock: Path) -> _Owner | None:
    """The (host, pid, token) written in a lock file, or None if it cannot be read."""
    try:
        host, _, rest = lock.read_text().strip().partition(":")
        pid, _, token = rest.partition(":")
        return _Owner(host, int(pid), token)
    except (OSError, ValueError):
        return None


def _owned(directory: Path, token: str) -> bool:
    """Whether a temporary directory is surgery's: it holds the ownership record with ``token``, or it is a whole
    surgery output by its manifest (a new output complete before its swap, or the previous one after it)."""
    try:
        record = directory / _OWNER_NAME
        if stat.S_ISREG(os.lstat(record).st_mode) and record.read_text() == token:
            return True
    except OSError:
        pass
    return _whole_or_empty(directory)


def _remove_owned(directory: Path, token: str) -> None:
    """Delete a temporary directory of this writer's, the ownership record last, so that a kill midway leaves a
    leftover the next writer can still prove is surgery's."""
    record = directory / _OWNER_NAME
    with suppress(OSError):
        if not record.exists():
            record.write_text(token)
        with os.scandir(directory) as found:
            items = [item for item in found if item.name != _OWNER_NAME]
        for item in items:
            if item.is_dir(follow_symlinks=False):
                shutil.rmtree(item.path, ignore_errors=True)
            else:
                os.unlink(item.path)
        record.unlink()
        directory.rmdir()


def _remove_leftovers(out: Path, dead: _Owner) -> None:
    """Remove the temporary of ``out`` that the lock of a dead writer names (and only that one)."""
    if not dead.token:  # a lock of surgery before 0.2 names no temporary
        return
    leftover = out.parent / f".{out.name}.tmp-{dead.pid}-{dead.token}"
    try:
        mode = os.lstat(leftover).st_mode
    except OSError:
        return
    if stat.S_ISREG(mode):  # a file write's temporary (the new bytes, or their record)
        leftover.unlink(missing_ok=True)
    elif stat.S_ISDIR(mode) and _owned(leftover, dead.token):
        _remove_owned(leftover, dead.token)


@contextmanager
def output_lock(out: Path, *, wait: float = 0.0) -> Iterator[str]:
    """Hold ``.NAME.lock`` beside ``out`` for the block and yield its token; a lock of a dead process is taken over.

    The lock holds ``host:pid:token``; the writer names its temporaries with the same pid and token,
    so after a kill the next writer removes exactly those. With ``wait``, a lock held by a live
    process is waited for up to that many seconds (file writes last moments); otherwise it is refused.

    Example:
        >>> import tempfile
        >>> out = Path(tempfile.mkdtemp()) / "m"
        >>> with output_lock(out) as token:
        ...     (out.parent / ".m.lock").read_text().endswith(f":{token}")
        True
    """
    lock = out.parent / f".{out.name}.lock"
    host, token = socket.gethostname(), uuid.uuid4().hex[:8]
    deadline, takeovers, dead = time.monotonic() + wait, 0, None
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            owner = _lock_owner(lock)
            if owner is not None and owner.host == host and not _pid_alive(owner.pid):
                takeovers += 1
                if takeovers > 2:
                    raise OutputPathError(f"cannot take the lock file {lock}; another writer keeps replacing it, "
                                          "try again") from None
                lock.unlink(missing_ok=True)  # its writer was killed: take over
                dead = owner
                continue
            if time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            who = f"process {owner.pid} on {owner.host}" if owner else "another process"
            raise OutputPathError(
                f"{out} is being written by {who} (lock file {lock}); wait for it to finish, or delete the lock "
                "file if that process is gone"
            ) from None
        with os.fdopen(fd, "w") as handle:
            handle.write(f"{host}:{os.getpid()}:{token}")
        break
    try:
        if dead is not None:
            _remove_leftovers(out, dead)
        yield token
    finally:
        if _lock_owner(lock) == (host, os.getpid(), token):
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
    ``overwrite`` replaces only a directory surgery wrote whole (see :func:`output_problem`). The
    block's files get their manifest (:data:`OUTPUT_MANIFEST`) last, before the rename.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> with atomic_directory(root / "model") as tmp:
        ...     _ = (tmp / "a.txt").write_text("x")
        >>> (root / "model" / "a.txt").read_text(), sorted(p.name for p in (root / "model").iterdir())
        ('x', ['.surgery-manifest.json', 'a.txt'])
        >>> sorted(p.name for p in root.iterdir())
        ['model']
    """
    out = Path(out_dir).expanduser().resolve()
    _check_target(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(out) as token:  # removes the temporary a killed writer's lock names
        restore_stranded(out)  # a previous output stranded by a killed swap is put back first
        _check_target(out, overwrite)  # again, now that no other writer can change the answer
        tmp = _temporary_name(out, "tmp", token)
        tmp.mkdir()
        (tmp / _OWNER_NAME).write_text(token)
        _WRITING.add(tmp)
        try:
            yield tmp
            write_output_manifest(tmp)
            _place(tmp, out, overwrite, token)
        finally:
            _WRITING.discard(tmp)
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


def _place(tmp: Path, out: Path, overwrite: bool, token: str) -> None:
    with _signals_deferred():  # a signal lands before the swap (nothing replaced) or after it (all saved)
        if overwrite and out.exists():
            _check_target(out, overwrite)  # a lockless writer may have put its files there meanwhile
            (tmp / _OWNER_NAME).unlink(missing_ok=True)  # the new output holds exactly what its manifest lists
            if exchange(tmp, out):
                _SAVED.append(out)
                _remove_owned(tmp, token)  # the previous output, now under the temporary name
                return
            old = _temporary_name(out, "old", token)
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
            _remove_owned(tmp, token)
            return
        (tmp / _OWNER_NAME).unlink(missing_ok=True)
        try:
            # rename(2) replaces a missing path or an empty directory, and refuses a non-empty one.
            os.rename(tmp, out)
        except OSError as exc:
            raise _created_meanwhile(out, exc) from None
        _SAVED.append(out)


def _inside_output_being_written(file: Path) -> bool:
    """Whether ``file`` lies in a directory :func:`atomic_directory` is writing (its manifest will record it)."""
    with suppress(OSError):
        folder = file.parent.resolve()
        return folder in _WRITING or any(parent in _WRITING for parent in folder.parents)
    return False


def _write_synced(file: Path, payload: bytes) -> None:
    with file.open("xb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())


def atomic_write(path: str | os.PathLike[str], data: str | bytes, *, overwrite: bool = False,
                 record: bool = True) -> Path:
    """Write ``data`` to the file ``path`` so that a reader sees the old file or the whole new one, never a part.

    Under the lock ``.NAME.lock`` (see :func:`output_lock`; a killed writer's temporary is removed,
    nothing else), the bytes go to a temporary sibling ``.NAME.tmp-<pid>-<token>`` first, flushed to
    disk, which then takes the name: with ``overwrite`` by ``rename(2)``, which replaces atomically,
    and only a file surgery wrote (:func:`file_problem`); without it by ``link(2)``, which fails if
    the name exists, so a file that appeared meanwhile is never replaced. Then surgery's record of
    the file (:func:`file_record`) is written beside it, which a later ``overwrite`` checks; a file
    inside a directory being written by :func:`atomic_directory` needs none (that directory's
    manifest records it), nor does one of surgery's own caches (``record=False``).

    Example:
        >>> import tempfile
        >>> f = Path(tempfile.mkdtemp()) / "report.json"
        >>> atomic_write(f, "{}\\n").read_text()
        '{}\\n'
        >>> atomic_write(f, "[]")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.OutputPathError: .../report.json exists; pass --overwrite to replace it, ...
        >>> atomic_write(f, "[]", overwrite=True).read_text(), sorted(p.name for p in f.parent.iterdir())
        ('[]', ['.report.json.surgery-record.json', 'report.json'])
    """
    out = Path(path).expanduser().absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    recorded = record and not _inside_output_being_written(out)
    payload = data.encode() if isinstance(data, str) else data
    with output_lock(out, wait=_FILE_LOCK_WAIT) as token:
        problem = file_problem(out, overwrite=overwrite, recorded=recorded)
        if problem is not None:
            raise OutputPathError(problem)
        tmp = _temporary_name(out, "tmp", token)
        try:
            _write_synced(tmp, payload)
            if overwrite:
                os.replace(tmp, out)
            else:
                _link_new(tmp, out, payload)
            tmp.unlink(missing_ok=True)
            if recorded:  # under the same temporary name, which the lock names
                _write_synced(tmp, (json.dumps({"format": _RECORD_FORMAT, "name": out.name, "size": len(payload),
                                                "sha256": hashlib.sha256(payload).hexdigest()}) + "\n").encode())
                os.replace(tmp, file_record(out))
        finally:
            tmp.unlink(missing_ok=True)
    _SAVED.append(out)
    return out


def _link_new(tmp: Path, out: Path, payload: bytes) -> None:
    """Give ``tmp``'s file the name ``out`` only if ``out`` does not exist (``link(2)``, else ``O_EXCL``)."""
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
            raise OutputPathError(f"{out} exists; pass --overwrite to replace it, or choose a new file") from None
