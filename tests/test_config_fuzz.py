"""Property: whatever cluster.yaml holds, `plan --offline --json` (config loader, profile, flags,
checkpoint, planner) ends in exit 0, 2 or 3 with a message, never a traceback (issue #19).
Structure-aware documents from tests/config_fuzz.py, derandomized so the suite is deterministic;
scripts/fuzz_config.py runs thousands more."""

from hypothesis import HealthCheck, given, settings

from config_fuzz import documents, run_plan


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(documents())
def test_plan_offline_never_traces(data):
    outcome = run_plan(data)
    assert outcome.problem is None, outcome.problem
