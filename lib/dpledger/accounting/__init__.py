"""The privacy ledger: accountants (PLD, RDP, random allocation, Monte Carlo), group-level ε, σ calibration and the record."""

from dpledger.accounting.accountants import (
    ACCOUNTANTS,
    AllocationAccountant,
    MonteCarloAccountant,
    PldAccountant,
    RdpAccountant,
    default_accountant,
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
    "AllocationAccountant",
    "Calibration",
    "CalibrationRecord",
    "GroupEpsilon",
    "MechanismDescription",
    "MonteCarloAccountant",
    "PldAccountant",
    "RdpAccountant",
    "calibrate_noise",
    "default_accountant",
    "describe",
    "get_accountant",
    "group_table",
    "require_support",
]
