"""Canary audits (paper 002): an empirical lower bound ε_emp beside the ledger's claim.

- :mod:`estimate`: ε_emp from game scores with valid threshold selection (bonferroni, split) or the
  paper's uncorrected maximum (max);
- :mod:`models`, :mod:`samplers`, :mod:`simulate`, :mod:`bgm`: the batched Gaussian mechanism per
  sampler with exact likelihood ratios, chunked and vectorized (numpy threads, torch on a GPU);
- :mod:`dpsgd`: DP-SGD (Audit) with gradient canaries under the Natural / Partially-Informed threat
  models;
- :mod:`verdict`: contradicted / consistent / inconclusive, and the N that would settle it;
- :mod:`selfcheck`: the false-alarm rate of a threshold method on mechanisms with known ε;
- :mod:`canaries` (imported by the train stage), :mod:`one_run` and its bounds: the one-run audit
  of the real training run.

The package imports none of them, so the train stage, which records the canaries, depends on
:mod:`canaries` alone and not on the audits' code.
"""
