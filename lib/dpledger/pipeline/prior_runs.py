"""The train stage's privately trained starting points (:mod:`dpledger.accounting.across_runs`).

A run that starts from a folder dpledger published (``train.model_options.path``, or the base
model of a peft adapter given there) continues a private model. Its claim is then:

- ``train.prior_data: overlapping``: the composition of every run the folder's ``privacy.json``
  composed with this run's own;
- ``train.prior_data: disjoint`` (declared by the user): this run's own, the earlier runs named in
  the card and report as declared disjoint. Refused when the earlier run's training rows are this
  run's (their fingerprints agree);
- unset: refused, in one line naming the folder and its ε.

A folder with a dpledger model card but no ``privacy.json`` (published before the file existed)
is refused unless declared disjoint: its claim cannot be composed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from dpledger.accounting.across_runs import (
    PRIVACY_FILE,
    Provenance,
    RunClaim,
    alone,
    continued,
    load_provenance,
)
from dpledger.accounting.record import CalibrationRecord
from dpledger.errors import ParamsError
from dpledger.ledger import Ledger
from dpledger.models.lora import adapter_base
from dpledger.params import Params
from dpledger.params.lora import is_adapter_folder

CARD = "README.md"
CARD_TAG = "dpledger"
"""The tag of dpledger's model cards (``model_card.TAGS``)."""


@dataclass(frozen=True)
class Prior:
    """A privately trained starting point: its folder and the claims it records."""

    folder: Path
    provenance: Provenance


def starting_folders(params: Params, root: Path) -> list[Path]:
    """The folders the model's weights are read from: ``train.model_options.path`` (relative to
    the project root) and, for a peft adapter folder, its base model's folder."""
    path = params.train.model_options.get("path") if params.train.model == "hf" else None
    if not isinstance(path, str):
        return []
    folder = root / path
    folders = [folder]
    if is_adapter_folder(str(folder)):
        folders.append(root / adapter_base(str(folder)))
    return [f for f in folders if f.is_dir()]


def _has_dpledger_card(folder: Path) -> bool:
    """Whether ``folder`` holds a model card dpledger wrote (its front matter's tags)."""
    card = folder / CARD
    if not card.is_file():
        return False
    parts = card.read_text(encoding="utf-8", errors="replace").split("---\n", 2)
    try:
        header = yaml.safe_load(parts[1]) if len(parts) == 3 else None
    except yaml.YAMLError:
        return False
    return isinstance(header, dict) and CARD_TAG in (header.get("tags") or [])


def find_prior(params: Params, root: Path, data: str) -> Prior | None:
    """The privately trained starting point of this run, checked against ``train.prior_data``
    (``data``: the fingerprint of this run's training rows); None when the model starts from
    public weights or from scratch. Refuses (one line) where the declaration is missing or
    contradicted."""
    declared = params.train.prior_data
    for folder in starting_folders(params, root):
        record = folder / PRIVACY_FILE
        if not record.is_file():
            if _has_dpledger_card(folder) and declared != "disjoint":
                raise ParamsError(
                    f"train.model_options.path: {folder} was trained privately by dpledger but holds no {PRIVACY_FILE} to compose its ε with this run's; publish it again with this version, or set train.prior_data: disjoint if its training data and this run's share no example"  # noqa: E501
                )
            continue
        provenance = load_provenance(record)
        composed = provenance.composition
        if declared is None:
            raise ParamsError(
                f"train.prior_data is unset, but train.model_options.path {folder} was trained privately (ε = {composed.epsilon:.4g} at δ = {composed.delta:.3g}): set it to overlapping (its ε is composed into this run's claim) or disjoint (its training data and this run's share no example)"  # noqa: E501
            )
        if declared == "disjoint" and any(run.data == data for run in composed.runs):
            raise ParamsError(
                "train.prior_data = 'disjoint' is contradicted: "
                f"{folder} was trained on this run's own training rows (same fingerprint); "
                "set train.prior_data: overlapping"
            )
        return Prior(folder, provenance)
    return None


def this_run(record: CalibrationRecord, ledger: Ledger, data: str) -> RunClaim:
    """This run's own claim as the ledger has it: ε spent after the steps done."""
    return RunClaim(
        epsilon=float(ledger.epsilon_spent),
        delta=float(record.delta),
        accountant=record.accountant,
        description=asdict(record.description),
        steps_done=ledger.steps_done,
        data=data,
    )


def provenance(prior: Prior | None, declared: str | None, run: RunClaim) -> Provenance:
    """The published model's claims: this run's composed with the prior's (overlapping data), or
    alone with the prior's runs named (declared disjoint, or no private starting point)."""
    if prior is None:
        return alone(run)
    if declared == "overlapping":
        return continued(prior.provenance, run)
    return alone(run, prior.provenance.composition.runs)
