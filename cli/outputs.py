"""Every path a command writes, decided in one place before any work starts.

A command names its inputs (model directories, data and config files) and its outputs (the ``--out``
directory it replaces atomically, result files such as ``--report``, ``--json`` or the PNGs of
``plot``); :func:`decide_outputs` refuses, in one line, any output that would destroy something the
user owns:

* an output directory that is, contains or lies inside an input;
* a result file inside an input model directory, equal to an input file, or inside the output
  directory (which the save replaces, so the file would be lost or would overwrite what was saved);
* two outputs that are the same file;
* an existing file, unless ``--overwrite`` was given, and even then one surgery did not write (its record
  beside it must match it: :func:`surgery.persist.atomic.file_problem`);
* an output directory that ``--overwrite`` must not replace: ``/``, the working directory, any user's home
  directory, an ancestor of one, or a directory holding anything surgery's manifest does not list
  (only an empty directory or one surgery wrote whole may be replaced:
  :func:`surgery.persist.atomic.output_problem`);
* an output under an existing file, or in a directory that is not writable.

Symlinks are resolved first, so a link to an input's ``config.json`` is that file. The files are
then written with :func:`surgery.persist.atomic.atomic_write`, which checks again under its lock.
The paths decided are remembered (:func:`decided_outputs`), so that an interrupted command names
only the outputs it was asked for among those it had saved, never its internal temporaries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from surgery.cli.inputs import check_output_dir, check_writable_file
from surgery.core.errors import OutputPathError
from surgery.persist.atomic import check_separate, file_problem

_DECIDED: list[Path] = []


@dataclass(frozen=True)
class Outputs:
    """The checked output paths of one command: the ``--out`` directory (or None) and each result file by flag."""

    directory: Path | None = None
    files: dict[str, Path] = field(default_factory=dict)
    overwrite: bool = False

    def file(self, flag: str) -> Path | None:
        """The checked path given with ``flag``, None if the option was not given."""
        return self.files.get(flag)


def decided_outputs() -> tuple[Path, ...]:
    """Every output path :func:`decide_outputs` has accepted in this process, oldest first (resolved).

    Example:
        >>> import tempfile
        >>> out = Path(tempfile.mkdtemp()).resolve() / "o"
        >>> _ = decide_outputs([], out=("--out", out))
        >>> decided_outputs()[-1] == out
        True
    """
    return tuple(_DECIDED)


def _existing(inputs: Sequence[str | Path | None]) -> tuple[list[Path], list[Path]]:
    """Input directories and files that exist on disk (a data set name such as rotten-tomatoes is neither)."""
    dirs, files = [], []
    for item in inputs:
        if item is None:
            continue
        path = Path(item).expanduser()
        if path.is_dir():
            dirs.append(path.resolve())
        elif path.exists():
            files.append(path.resolve())
    return dirs, files


def decide_outputs(inputs: Sequence[str | Path | None], *, out: tuple[str, str | Path | None] | None = None,
                   files: Sequence[tuple[str, str | Path | None]] = (), overwrite: bool = False) -> Outputs:
    """Check every output path of a command against its inputs and each other; raise OutputPathError otherwise.

    Args:
        inputs: the paths the command reads (model directories, data and config files); names that
            are not on disk are ignored.
        out: ``(flag, directory)`` that the command writes atomically, or None.
        files: ``(flag, file)`` pairs of result files; None entries (option not given) are skipped.
        overwrite: whether ``--overwrite`` was given (an existing ``--out`` or file that surgery wrote).

    Example:
        >>> import tempfile
        >>> model = Path(tempfile.mkdtemp()).resolve()
        >>> _ = (model / "config.json").write_text("{}")
        >>> decide_outputs([model], out=("--out", model.parent / "o"),
        ...                files=[("--report", model / "config.json")])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.OutputPathError: --report .../config.json is inside the input model directory ...
        >>> decide_outputs([model], out=("--out", model.parent / "o"),
        ...                files=[("--report", model.parent / "o" / "r.json")])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.OutputPathError: --report .../o/r.json is inside --out ..., which this command writes; ...
    """
    dirs, input_files = _existing(inputs)
    directory = None
    out_flag = ""
    if out is not None and out[1] is not None:
        out_flag = out[0]
        for source in dirs:
            check_separate(source, out[1], flag=out_flag)
        directory = check_output_dir(out[1], overwrite=overwrite, flag=out_flag)
        for file in input_files:
            if directory is not None and directory in file.parents:
                raise OutputPathError(f"{out_flag} {directory} contains the input file {file}, which writing there "
                                      "could destroy; choose another directory")
    checked: dict[str, Path] = {}
    taken: dict[Path, str] = {}
    for flag, given in files:
        file = check_writable_file(Path(given), flag) if given is not None else None
        if file is None:
            continue
        real = file.resolve()
        for source in dirs:
            if real == source or source in real.parents:
                raise OutputPathError(f"{flag} {file} is inside the input model directory {source}; choose a file "
                                      "outside it")
        if real in input_files:
            raise OutputPathError(f"{flag} {file} is an input of this command; choose another file")
        if directory is not None and (real == directory or directory in real.parents):
            raise OutputPathError(f"{flag} {file} is inside {out_flag} {directory}, which this command writes; "
                                  "choose a file outside it")
        if real in taken:
            raise OutputPathError(f"{flag} {file} is also the file of {taken[real]}; give each output its own file")
        problem = file_problem(file, overwrite=overwrite, flag=flag)
        if problem is not None:
            raise OutputPathError(problem)
        taken[real] = flag
        checked[flag] = file
    _DECIDED.extend([*([directory] if directory is not None else []), *(f.resolve() for f in checked.values())])
    return Outputs(directory=directory, files=checked, overwrite=overwrite)
