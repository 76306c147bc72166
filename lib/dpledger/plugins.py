"""``module:callable`` references, shared by plugin samplers (``schedule.sampler``) and plugin
models (``train.model``): one grammar, one importer, one set of error messages."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dpledger.errors import ParamsError

PLUGIN_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def is_plugin_name(name: str) -> bool:
    """True for a ``module:callable`` reference."""
    return bool(PLUGIN_PATTERN.match(name))


def load_callable(name: str, key: str, what: str) -> Callable[..., Any]:
    """Import the callable ``module:attr`` named by params key ``key``; a malformed reference, a
    missing module or attribute, or a non-callable is a one-line :class:`ParamsError` (``what``:
    e.g. "a plugin sampler")."""
    if not is_plugin_name(name):
        raise ParamsError(f"{key} = {name!r} is invalid: {what} is written module:callable")
    module_name, attribute = name.split(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise ParamsError(
            f"{key} = {name!r} is invalid: cannot import module {module_name!r} ({error})"
        ) from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ParamsError(
                f"{key} = {name!r} is invalid: "
                f"module {module_name!r} has no attribute {attribute!r}"
            )
        target = getattr(target, part)
    if not callable(target):
        raise ParamsError(f"{key} = {name!r} is invalid: {attribute!r} is not callable")
    return target


def plugin_source(name: str) -> Path | None:
    """The source file of the module of a ``module:callable`` reference (imported), or None for a
    built-in name or a module without one: what a changed plugin changes, for the train stage's
    fingerprint."""
    if not is_plugin_name(name):
        return None
    try:
        module = importlib.import_module(name.split(":")[0])
    except ImportError:
        return None
    file = getattr(module, "__file__", None)
    return Path(file) if file and Path(file).is_file() else None
