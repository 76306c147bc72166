"""The secret key of a run's Gaussian noise, and where it came from.

DP-SGD's guarantee holds against an adversary who does not know the noise. The noise of step t is a
function of (key, t) (``engine/noise.py``), so whoever can derive the key can subtract every draw
and the released model becomes a deterministic function of the data. A key derived from a tracked
value (``seed`` in params.yaml) is known to anyone holding the repository; the key therefore comes
from, in this order:

1. the environment variable ``DPLEDGER_NOISE_KEY`` (at least 32 hexadecimal digits: 128 bits);
2. the untracked file ``train.noise_key_file`` (the same format; refused when git tracks it or when
   it lies in the repository without being git-ignored);
3. otherwise the operating system's CSPRNG (256 bits), new for each run that starts at step 0.

The key is kept in the sealed checkpoint (the weights file under ``artifacts/train/``, which is
git-ignored and never pushed: ``push: false`` in dvc.yaml), so a killed run resumes with the same
noise. ``train.insecure_public_seed: true`` is the explicit opt-in to the old public derivation
from ``seed`` (bit-for-bit reproducible from the repository alone, with no privacy guarantee
against anyone who has it); the report and the model card then say so in red.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpledger.errors import ParamsError
from dpledger.ledger import PUBLIC_KEY_WARNING

ENVIRONMENT_VARIABLE = "DPLEDGER_NOISE_KEY"
KEY_BITS = 256
MIN_HEX_DIGITS = 32
"""A provided key has at least 128 bits."""


@dataclass(frozen=True)
class NoiseKey:
    """A noise key (``value``, never printed) and ``source``: where it came from, in words.
    ``public``: derivable from tracked files (the explicit opt-in only). ``provided``: given by the
    user, so a resume must find the same key in its checkpoint."""

    value: int = field(repr=False)
    source: str
    public: bool = False
    provided: bool = False

    def identity(self) -> str:
        """What the checkpoint fingerprint holds of the key: a provided or public key's SHA-256
        (a different key starts over), or ``random`` (the saved key is taken back on resume)."""
        if not (self.provided or self.public):
            return "random"
        return hashlib.sha256(self.to_hex().encode()).hexdigest()

    def to_hex(self) -> str:
        """The key as hexadecimal digits (how the sealed checkpoint stores it)."""
        return f"{self.value:x}"


def public_seed_key(seed: int) -> int:
    """The noise key derived from the tracked ``seed`` (the derivation used before keys were
    secret; kept so that an opted-in run reproduces the outputs of that time)."""
    return int(np.random.SeedSequence([seed, 1]).generate_state(1)[0])


def parse_key(text: str, where: str) -> int:
    """The key written as hexadecimal digits in ``text`` (surrounding white space ignored)."""
    digits = text.strip().lower().removeprefix("0x")
    if not re.fullmatch(r"[0-9a-f]+", digits) or len(digits) < MIN_HEX_DIGITS:
        raise ParamsError(
            f"params: the noise key in {where} is invalid: it must be at least {MIN_HEX_DIGITS} hexadecimal digits (128 bits), e.g. the output of: python -c 'import secrets; "  # noqa: E501
            "print(secrets.token_hex(32))'"
        )
    return int(digits, 16)


def _git(root: Path, *args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, check=False
        )
    except OSError:  # no git: nothing can be tracked
        return None


def _key_file_problem(path: Path) -> str | None:
    """Why the key file ``path`` is not secret (git tracks it, or it sits in the work tree
    without being ignored, one ``git add`` from being pushed), or None."""
    folder = path.resolve().parent
    top = _git(folder, "rev-parse", "--show-toplevel")
    if top is None or top.returncode != 0:
        return None  # outside any repository
    if (
        tracked := _git(folder, "ls-files", "--error-unmatch", path.name)
    ) and not tracked.returncode:
        return "git tracks it"
    ignored = _git(folder, "check-ignore", "-q", path.name)
    if ignored is not None and ignored.returncode != 0:
        return "it is in the repository and not git-ignored"
    return None


def resolve_noise_key(seed: int, key_file: str | None, public_seed: bool, root: Path) -> NoiseKey:
    """The run's noise key: the opted-in public seed, the environment variable, the key file, or a
    fresh CSPRNG key, in that order (see the module's docstring); a key file that is not secret is
    refused with one line unless ``public_seed`` opts in to a public key anyway."""
    if public_seed:
        return NoiseKey(
            public_seed_key(seed),
            f"derived from the tracked seed = {seed} (train.insecure_public_seed)",
            public=True,
        )
    if text := os.environ.get(ENVIRONMENT_VARIABLE):
        value = parse_key(text, f"the environment variable {ENVIRONMENT_VARIABLE}")
        return NoiseKey(value, f"the environment variable {ENVIRONMENT_VARIABLE}", provided=True)
    if key_file is not None:
        path = Path(key_file) if Path(key_file).is_absolute() else root / key_file
        if not path.is_file():
            raise ParamsError(f"params: train.noise_key_file = {key_file!r} is not a file")
        if problem := _key_file_problem(path):
            raise ParamsError(
                f"params: train.noise_key_file = {key_file!r} is refused: {problem}, so its key would be public; move it out of the repository or git-ignore it (or set train.insecure_public_seed: true for a run with {PUBLIC_KEY_WARNING})"  # noqa: E501
            )
        value = parse_key(path.read_text(), f"train.noise_key_file = {key_file!r}")
        return NoiseKey(
            value, f"the untracked file train.noise_key_file = {key_file}", provided=True
        )
    return NoiseKey(
        secrets.randbits(KEY_BITS), "the operating system's CSPRNG (kept in the sealed checkpoint)"
    )


def key_from_checkpoint(key: NoiseKey, saved: str | None) -> NoiseKey:
    """The key a resumed run continues with: a fresh random key gives way to the one sealed in the
    checkpoint. A provided or public key stays: the checkpoint's fingerprint holds its hash, so a
    checkpoint of another key is never resumed."""
    if saved is None or key.provided or key.public:
        return key
    return NoiseKey(int(saved, 16), key.source)
