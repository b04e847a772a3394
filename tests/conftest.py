"""Settings for the whole suite."""

import os

from hypothesis import HealthCheck, settings

# The machine is shared (Spark JVMs, servers, helpers' runs): a property test's input generation may be slow for a
# moment without anything being wrong with the strategy, and timing is never what these tests check.
# Derandomized: a property test tries the same examples in every run, so `make test` fails only for a change, never
# for a lucky draw; HEADRACE_HYPOTHESIS=explore draws new examples each run (to look for new failures).
settings.register_profile("headrace", suppress_health_check=[HealthCheck.too_slow], deadline=None, derandomize=True)
settings.register_profile("explore", suppress_health_check=[HealthCheck.too_slow], deadline=None)
settings.load_profile(os.environ.get("HEADRACE_HYPOTHESIS", "headrace"))
