"""A model directory is untrusted input: no custom code runs, no pickle is read, safetensors are checked.

A ``config.json`` (or ``tokenizer_config.json``) whose ``auto_map`` points at Python files in the
directory asks transformers to run them; surgery always passes ``trust_remote_code=False`` and, for a
model type transformers does not know itself, refuses the directory in one line before transformers
could prompt. surgery reads weights from safetensors only: a ``pytorch_model.bin``/``.pt``/``.pth`` file is a
pickle, and unpickling runs code. Such a directory is refused with a line that says how to convert
it, unless the caller opts in to torch's weights-only loader. A safetensors file is checked before it
is read: its header must parse and its tensors must lie within the file, so a corrupt or truncated
download is reported in one line instead of a ``SafetensorError`` traceback.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import struct
from pathlib import Path
from typing import Any

from surgery.core.errors import ModelLoadError

SAFETENSORS = ("model.safetensors", "model.safetensors.index.json")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
CONVERT_HINT = (
    "convert it once, in an environment you trust: python -c \"import torch, safetensors.torch as s; "
    "s.save_file(torch.load('pytorch_model.bin', weights_only=True), 'model.safetensors')\" "
    "(or pass allow_pickle=True / --allow-pickle to load it with torch's weights-only loader)"
)
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
                "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


#: Largest JSON file (config.json, surgery.json, tokenizer_config.json) read: real ones are kilobytes.
MAX_JSON_BYTES = 16 * 2**20
#: Deepest nesting accepted in such a file: real configs and manifests nest 6 levels at most.
MAX_JSON_DEPTH = 32


def read_regular(file: Path, limit: int) -> bytes:
    """The bytes of ``file`` if it is a regular file (symlinks followed) of at most ``limit`` bytes.

    A FIFO would block the reader and ``/dev/zero`` would fill memory, so only regular files are read,
    and no more than ``limit`` bytes of them.

    Example:
        >>> read_regular(Path("/dev/zero"), 10)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ModelLoadError: /dev/zero is not a regular file (a device); ...
    """
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
        fd = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise ModelLoadError(f"cannot read {file}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ModelLoadError(f"{file} is not a regular file ({_kind(info.st_mode)}); replace it with the real file")
        if info.st_size > limit:
            raise ModelLoadError(f"{file} is {info.st_size} bytes, more than the {limit} surgery reads for it; it is "
                                 "not a real file of its kind")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ModelLoadError(f"{file} is larger than the {limit} bytes surgery reads for it")
    return data


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a file"


def json_depth(value: Any) -> int:
    """How deeply ``value`` nests lists and mappings (0 for a scalar), without recursion.

    Example:
        >>> json_depth({"a": [1, {"b": 2}]}), json_depth(3)
        (3, 0)
    """
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]")


def text_depth(data: bytes, limit: int) -> int:
    """How deeply JSON text nests its brackets (strings skipped), found without parsing and without recursion.

    Stops counting once past ``limit``, so a file nested 200,000 deep costs what a flat one does; a
    parser given such a file recurses once per level (``RecursionError``). JSON Lines text counts
    per line, as brackets balance on each.

    Example:
        >>> text_depth(b'{"a": [1, {"b": "[[["}]}', 32), text_depth(b"[" * 200_000, 32)
        (3, 33)
    """
    return _depth_walk(_NOT_BRACKET.sub(b"", _JSON_STRING.sub(b"", data)), 0, 0, limit)[1]


def _depth_walk(brackets: bytes, depth: int, deepest: int, limit: int) -> tuple[int, int]:
    for byte in brackets:
        depth += 1 if byte in b"[{" else -1
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                break
    return depth, deepest


def file_depth(file: Path, limit: int, *, chunk: int = 16 * 2**20) -> int:
    """:func:`text_depth` of a whole file of any size, read in line-aligned chunks (memory stays ``chunk``-sized).

    A JSON string cannot hold a raw newline, so no string spans two lines and a chunk that ends at a
    newline can be stripped of its strings on its own; the depth carries over from chunk to chunk.

    Example:
        >>> import tempfile
        >>> f = Path(tempfile.mkdtemp()) / "rows.jsonl"
        >>> _ = f.write_text('{"a": 1}\\n' * 1000 + "[" * 500 + "]" * 500 + "\\n")
        >>> file_depth(f, 64, chunk=100)
        65
    """
    depth = deepest = 0
    rest = b""
    with file.open("rb") as handle:
        while deepest <= limit:
            block = handle.read(chunk)
            data = rest + block
            cut = data.rfind(b"\n") + 1 if block else len(data)
            rest = data[cut:]
            if len(rest) > 4 * chunk:  # one enormous line: counted in pieces; a string split there may be
                cut, rest = len(data), b""  # miscounted by the brackets it holds, memory stays bounded
            depth, deepest = _depth_walk(_NOT_BRACKET.sub(b"", _JSON_STRING.sub(b"", data[:cut])), depth, deepest,
                                         limit)
            if not block:
                break
    return deepest


def read_json_file(file: Path, *, what: str = "file", fix: str = "re-download or re-save the model") -> Any:
    """Parse a JSON file of a model directory: a regular file, at most MAX_JSON_BYTES, nested MAX_JSON_DEPTH deep.

    Example:
        >>> import tempfile
        >>> f = Path(tempfile.mkdtemp()) / "config.json"
        >>> _ = f.write_text("[" * 100_000 + "]" * 100_000)
        >>> read_json_file(f)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ModelLoadError: .../config.json nests deeper than 32 levels; ...
    """
    data = read_regular(file, MAX_JSON_BYTES)
    deep = f"{file} nests deeper than {MAX_JSON_DEPTH} levels; it is not a real {what}, {fix}"
    try:
        value = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ModelLoadError(deep) from None
    except (UnicodeDecodeError, ValueError) as exc:
        detail = " ".join(str(exc).split())[:120]
        raise ModelLoadError(f"{file} is not valid JSON ({detail}); {fix}") from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise ModelLoadError(deep)
    return value


def check_regular_files(path: Path) -> None:
    """Refuse a model directory holding a FIFO, device or socket where files belong (symlinks followed).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> os.mkfifo(d / "model.safetensors")
        >>> check_regular_files(d)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ModelLoadError: .../model.safetensors is not a regular file (a FIFO); ...
    """
    if not path.is_dir():
        return
    for entry in path.iterdir():
        try:
            mode = entry.stat().st_mode
        except OSError:
            continue  # a dangling link: whoever needs the file reports it missing
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise ModelLoadError(f"{entry} is not a regular file ({_kind(mode)}); replace it with the real file")


#: How deep :func:`check_links_inside` looks for links in a model directory (sentence-transformers nests 1 level).
LINK_DEPTH = 4
#: The most entries it looks at: a model directory holds tens of files, not a file system.
LINK_ENTRIES = 10_000


def within(target: Path, base: Path) -> bool:
    """Whether the resolved ``target`` belongs to the resolved model directory ``base``.

    Inside ``base``, or, for a snapshot of the Hugging Face hub cache (``.../models--X/snapshots/<rev>``,
    whose files are links to ``../../blobs/<hash>``), one of that same cached repository's blobs.

    Example:
        >>> within(Path("/c/models--x/blobs/ab12"), Path("/c/models--x/snapshots/r1"))
        True
        >>> within(Path("/c/models--x/snapshots/other"), Path("/c/models--x/snapshots/r1"))
        False
    """
    if target.is_relative_to(base):
        return True
    repo = base.parent.parent
    return base.parent.name == "snapshots" and repo.name.startswith("models--") and target.parent == repo / "blobs"


def outside_message(named_in: Path | str, path: str | os.PathLike[str], root: Path) -> str:
    """The one-line refusal of ``path``, named in ``named_in``, that leads outside the model directory ``root``."""
    return (f"{named_in} names {str(path)!r}, which leads outside the model directory {root}; surgery reads nothing "
            "outside a model directory (links included): put the file inside it and name it by a relative path")


def path_inside(root: str | os.PathLike[str], path: str | os.PathLike[str], *, named_in: Path | str) -> Path:
    """``root / path`` with links resolved, refused in one line unless it lies inside ``root`` (resolved too).

    A path read from a file of a model directory (``modules.json``'s module ``path``, a shard name) is
    data, not a place to go: ``../elsewhere``, an absolute path or a link out of the directory would
    make surgery read (and echo in its errors) files the model's author chose anywhere on the
    machine. Nothing is opened here, so nothing outside is read.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> path_inside(d, "1_Pooling", named_in=d / "modules.json") == (d / "1_Pooling").resolve()
        True
        >>> path_inside(d, "../outside", named_in=d / "modules.json")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ModelLoadError: .../modules.json names '../outside', which leads outside the model ...
    """
    base = Path(root).resolve()
    given = Path(path)
    target = (base / given).resolve()
    if given.is_absolute() or not within(target, base):
        raise ModelLoadError(outside_message(named_in, path, base))
    return target


def check_links_inside(root: str | os.PathLike[str]) -> None:
    """Refuse a model directory holding a link (at any of its first :data:`LINK_DEPTH` levels) that leads out of it.

    ``config.json``, the tokenizer files, ``sentence_bert_config.json`` ... are read by their fixed
    names, so a link is the one way such a name could point at a file elsewhere; links within the
    directory are fine. Links are not followed while looking (a loop cannot trap the walk).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> (d / "tokenizer.json").symlink_to("/etc/hostname")
        >>> check_links_inside(d)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ModelLoadError: .../tokenizer.json is a link to /etc/hostname, outside the model ...
    """
    base = Path(root).resolve()
    if not base.is_dir():
        return
    pending, seen = [(base, 0)], 0
    while pending:
        folder, depth = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue  # unreadable: whoever needs a file in it reports it
        for entry in entries:
            seen += 1
            if seen > LINK_ENTRIES:
                return
            if entry.is_symlink():
                target = Path(entry.path).resolve()
                if not within(target, base):
                    raise ModelLoadError(f"{entry.path} is a link to {target}, outside the model directory {base}; "
                                         "surgery reads nothing outside a model directory: copy the file in instead "
                                         "of linking it")
            elif entry.is_dir(follow_symlinks=False) and depth + 1 < LINK_DEPTH:
                pending.append((Path(entry.path), depth + 1))


def _json_file(file: Path) -> dict[str, Any]:
    if not file.exists():
        return {}
    try:
        value = read_json_file(file)
    except ModelLoadError:
        return {}  # unreadable files are reported by whoever reads them for real
    return value if isinstance(value, dict) else {}


def refuse_custom_code(path: Path) -> None:
    """Refuse a directory that needs its own Python code (``auto_map`` with an unknown model type).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "config.json").write_text('{"model_type": "evil", "auto_map": {"AutoConfig": "evil.Config"}}')
        >>> refuse_custom_code(d)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ModelLoadError: ... asks to run Python code from the model directory (auto_map: ...
    """
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    check_regular_files(path)  # before anything in it is read
    check_links_inside(path)
    model_type = _json_file(path / "config.json").get("model_type")
    if isinstance(model_type, str) and model_type in CONFIG_MAPPING_NAMES:
        return  # transformers' own classes are used and any auto_map is ignored (trust_remote_code=False)
    for name in ("config.json", "tokenizer_config.json"):
        auto_map = _json_file(path / name).get("auto_map")
        if auto_map:
            shown = json.dumps(auto_map)[:120] if not isinstance(auto_map, dict) else ", ".join(
                sorted({str(v) for v in auto_map.values()}))[:120]
            raise ModelLoadError(
                f"{path / name} asks to run Python code from the model directory (auto_map: {shown}); surgery never "
                "runs code from a model directory: use a model whose model_type transformers supports"
            )


def pickled_weights(path: Path) -> list[Path]:
    """The pickle-format weight files in a model directory."""
    return sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in PICKLE_SUFFIXES
                  and not p.name.startswith("training_args"))


#: The files of an OpenVINO IR directory, as surgery.runtimes.openvino.openvino_ir writes them (OV_XML, OV_INFO).
OPENVINO_XML = "openvino_model.xml"
OPENVINO_RECORD = "surgery-openvino.json"


def openvino_ir(path: Path) -> bool:
    """Whether ``path`` is an OpenVINO IR directory (``openvino_model.xml``), surgery's export or another's.

    Example:
        >>> openvino_ir(Path("/nonexistent"))
        False
    """
    return (Path(path) / OPENVINO_XML).is_file()


def refuse_openvino_ir(path: Path) -> None:
    """Refuse an OpenVINO IR directory where a PyTorch model is needed, saying what it is and how it is used.

    Its weights are ``openvino_model.bin``, which is no pickle: calling it one (and suggesting
    ``torch.load`` of a file that does not exist) sent users the wrong way.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "openvino_model.xml").write_text("<net/>")
        >>> _ = (d / "surgery-openvino.json").write_text("{}")
        >>> refuse_openvino_ir(d)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ModelLoadError: ... is an OpenVINO IR written by `surgery export` (openvino_model.xml + ...
    """
    if not openvino_ir(path):
        return
    whose = "written by `surgery export`" if (path / OPENVINO_RECORD).is_file() else "(openvino_model.xml)"
    raise ModelLoadError(
        f"{path} is an OpenVINO IR {whose} (openvino_model.xml + .bin), a graph for the OpenVINO runtime, not "
        "PyTorch weights surgery reads: serve it with openvino (Core().compile_model of openvino_model.xml) or "
        f"optimum-intel's OVModelFor*.from_pretrained, time it with `surgery bench {path}` (no --runtime or --data: "
        "it runs as it is), and give inspect, apply, compress and export the model it was exported from"
    )


def require_safetensors(path: Path, *, allow_pickle: bool = False) -> None:
    """Refuse a directory whose weights exist only as pickles (unless ``allow_pickle``).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "pytorch_model.bin").write_bytes(b"x")
        >>> require_safetensors(d)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ModelLoadError: ... holds only pickled weights (pytorch_model.bin), which ...not load ...
    """
    if any((path / name).exists() for name in SAFETENSORS):
        return
    refuse_openvino_ir(path)  # openvino_model.bin is OpenVINO's weights, not a pickle
    pickles = pickled_weights(path)
    if pickles and not allow_pickle:
        raise ModelLoadError(f"{path} holds only pickled weights ({', '.join(p.name for p in pickles[:3])}), which "
                             f"surgery does not load because unpickling can run code; {CONVERT_HINT}")


def safetensors_shapes(file: Path) -> dict[str, list[int]]:
    """Tensor shapes from a safetensors header, after checking that the file is complete.

    Raises :class:`~surgery.core.errors.ModelLoadError` for a file that is truncated, corrupt or not
    safetensors at all.

    Example:
        >>> import tempfile, torch
        >>> from safetensors.torch import save_file
        >>> f = Path(tempfile.mkdtemp()) / "w.safetensors"
        >>> save_file({"a": torch.zeros(2, 3)}, str(f))
        >>> safetensors_shapes(f)
        {'a': [2, 3]}
        >>> _ = f.write_bytes(f.read_bytes()[:-4])
        >>> safetensors_shapes(f)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ModelLoadError: ... is truncated or corrupt ...
    """
    damaged = f"{file} is truncated or corrupt"
    fix = "re-download or re-save the model"
    try:
        size = file.stat().st_size
        if not stat.S_ISREG(file.stat().st_mode):
            raise ModelLoadError(f"{file} is not a regular file ({_kind(file.stat().st_mode)}); {fix}")
        with file.open("rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                raise ModelLoadError(f"{damaged} ({size} bytes, no safetensors header); {fix}")
            (length,) = struct.unpack("<Q", head)
            if length > size - 8 or length > 100_000_000:
                raise ModelLoadError(f"{damaged} (header length {length} exceeds the file); {fix}")
            header = json.loads(handle.read(length))
    except OSError as exc:
        raise ModelLoadError(f"cannot read {file}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError):
        raise ModelLoadError(f"{damaged} (its header is not valid JSON); {fix}") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"{damaged} (its header is not a mapping); {fix}")
    shapes: dict[str, list[int]] = {}
    spans: list[tuple[int, int, str]] = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            shape = [int(x) for x in info["shape"]]
            start, stop = (int(x) for x in info["data_offsets"])
            width = _DTYPE_BYTES[info["dtype"]]
        except (KeyError, TypeError, ValueError):
            raise ModelLoadError(f"{damaged} (tensor {name!r} has a malformed header entry); {fix}") from None
        if stop - start != math.prod(shape) * width or start < 0:
            raise ModelLoadError(f"{damaged} (tensor {name!r} has inconsistent offsets); {fix}")
        shapes[name] = shape
        spans.append((start, stop, name))
    end = 0
    # Like safetensors itself: the tensors tile the data area in order, no overlap and no gap.
    for start, stop, name in sorted(spans):
        if start != end:
            kind = "overlaps the tensor before it" if start < end else f"leaves a gap of {start - end} bytes before it"
            raise ModelLoadError(f"{damaged} (tensor {name!r} {kind}); {fix}")
        end = stop
    if 8 + length + end != size:
        raise ModelLoadError(f"{damaged} ({size} bytes, the header describes {8 + length + end}); {fix}")
    return shapes


def check_safetensors_dir(path: Path) -> None:
    """Check every safetensors file of a plain model directory (single file or shards)."""
    index = path / "model.safetensors.index.json"
    files = [path / "model.safetensors"] if (path / "model.safetensors").exists() else []
    if index.exists():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise ModelLoadError(f"{index} is damaged (no weight_map); re-download or re-save the model") from None
        for shard in shards:
            file = path_inside(path, str(shard), named_in=index)
            if not file.exists():
                raise ModelLoadError(f"{index} names the shard {shard}, which is missing; re-download the model")
            files.append(file)
    for file in files:
        safetensors_shapes(file)
