"""Hypothesis budgets for the property-based tests of the sans-I/O core.

`ci` (the default): a fixed number of examples, derandomized, so that every run of `make test` checks the same
cases in a known time and a failure reproduces. `fuzz`: a long randomized search for a developer's machine,
`HYPOTHESIS_PROFILE=fuzz .venv/bin/python -m pytest tests/wsserver -k fuzz`; what it finds shrinks to a small
example that belongs in a regression test.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=150, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("fuzz", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
