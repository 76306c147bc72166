"""Shared fixtures, oracles and project builders for the tests (no tests here)."""
