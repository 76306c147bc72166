"""The privacy ledger: accountants (PLD, RDP, random allocation, Monte Carlo), group-level ε, σ
calibration and the record.

The names below are loaded on first use (PEP 562): params validation imports only the description
vocabulary, and should not pay for torch and dp-accounting, which the accountants load.
"""

from importlib import import_module
from typing import Any

_HOMES = {
    "ACCOUNTANTS": "accountants",
    "AllocationAccountant": "accountants.allocation",
    "MonteCarloAccountant": "accountants.montecarlo",
    "PldAccountant": "accountants.pld",
    "RdpAccountant": "accountants.rdp",
    "accountant_of": "accountants",
    "get_accountant": "accountants",
    "require_support": "accountants",
    "resolve_accountant": "accountants",
    "Calibration": "calibrate",
    "calibrate_noise": "calibrate",
    "epsilon_curve": "calibrate",
    "SAMPLERS": "description",
    "MechanismDescription": "description",
    "describe": "description",
    "GroupEpsilon": "group",
    "group_table": "group",
    "AccountantResult": "record",
    "CalibrationRecord": "record",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_HOMES[name]}"), name)
