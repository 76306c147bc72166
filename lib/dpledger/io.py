"""Atomic writers: an interrupted stage never leaves a half-written output behind.

Each writer writes to a temporary file in the destination directory and renames it into
place (``os.replace`` is atomic on POSIX within one file system).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from dpledger.errors import DpledgerError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; move it onto ``path`` only if the block succeeds."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        # mkstemp creates 0600; give the output the permissions a plain open() would.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()


def json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot serialise {type(value).__name__} to JSON")


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically; numpy scalars and arrays are converted."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=json_default) + "\n")


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_npz(path: str | os.PathLike[str], **arrays: np.ndarray) -> None:
    """Save arrays to a compressed ``.npz`` atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as handle:
            np.savez_compressed(handle, **arrays)


def write_csv(
    path: str | os.PathLike[str], header: list[str], rows: list[list[Any]] | np.ndarray
) -> None:
    """Write a CSV (comma-separated, one header line) atomically; the format ``dvc plots`` reads."""
    lines = [",".join(header)]
    lines += [",".join(_csv_cell(v) for v in row) for row in rows]
    write_text(path, "\n".join(lines) + "\n")


def _csv_cell(value: Any) -> str:
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    return str(value)


@contextmanager
def reading_artifact(path: str | os.PathLike[str], stage: str) -> Iterator[None]:
    """Turn a missing, truncated or hand-edited artifact read in the block into one line naming the
    file and the stage that rebuilds it (instead of a traceback from json, numpy or a
    constructor)."""
    try:
        yield
    except (
        OSError,
        EOFError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        zipfile.BadZipFile,
    ) as error:
        raise DpledgerError(
            f"{path} is unreadable or corrupt ({type(error).__name__}: {error}); "
            f"rebuild it with `dvc repro -f {stage}`".splitlines()[0]
        ) from None


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file."""
    return json.loads(Path(path).read_text())


@contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a fresh temporary directory; it replaces ``path`` as a whole only if the block
    succeeds."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
        backup = None
        if target.exists():
            backup = target.with_name(f".{target.name}.old")
            if backup.exists():
                shutil.rmtree(backup)
            os.replace(target, backup)
        os.replace(tmp, target)
        if backup is not None:
            shutil.rmtree(backup)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
