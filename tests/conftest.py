"""Settings for the whole suite."""

from hypothesis import HealthCheck, settings

# The machine is shared (Spark JVMs, servers, helpers' runs): a property test's input generation may be slow for a
# moment without anything being wrong with the strategy, and timing is never what these tests check.
settings.register_profile("headrace", suppress_health_check=[HealthCheck.too_slow], deadline=None)
settings.load_profile("headrace")
