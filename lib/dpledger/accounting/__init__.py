"""The privacy ledger: accountants (PLD, RDP, Monte Carlo), group-level ε, σ calibration and the record."""

from dpledger.accounting.accountants import (
    ACCOUNTANTS,
    MonteCarloAccountant,
    PldAccountant,
    RdpAccountant,
    get_accountant,
    require_support,
)
from dpledger.accounting.calibrate import Calibration, calibrate_noise
from dpledger.accounting.description import SAMPLERS, MechanismDescription, describe
from dpledger.accounting.group import GroupEpsilon, group_table
from dpledger.accounting.record import AccountantResult, CalibrationRecord

__all__ = [
    "ACCOUNTANTS",
    "SAMPLERS",
    "AccountantResult",
    "Calibration",
    "CalibrationRecord",
    "GroupEpsilon",
    "MechanismDescription",
    "MonteCarloAccountant",
    "PldAccountant",
    "RdpAccountant",
    "calibrate_noise",
    "describe",
    "get_accountant",
    "group_table",
    "require_support",
]
