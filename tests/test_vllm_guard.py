"""vLLM 0.33's startup memory guard (launcher/inputs/vllm_guard.py) against the real message's figures."""

import json

import pytest

from conftest import ROOT
from launcher.plan import cluster_plan as plan
from launcher.inputs import vllm_guard
from launcher.inputs.vllm_guard import GIB

GB10_TOTAL = 127_600_000 * 1024  # 121.69 GiB
RUNTIME = 14 * GIB


def test_refusal_is_vllms_message():
    """The field's refusal: 85.92 of 121.69 GiB free, the default 0.92 wants 111.95 GiB."""
    free = int(85.92 * GIB)
    assert vllm_guard.refusal(free, GB10_TOTAL, vllm_guard.DEFAULT_UTILIZATION) == (
        "Free memory on device cuda:0 (85.92/121.69 GiB) on startup is less than desired GPU "
        "memory utilization (0.92, 111.95 GiB). Decrease GPU memory utilization or reduce GPU "
        "memory used by other processes.")


def test_guard_boundary_is_ceil_of_total_times_utilization():
    need = vllm_guard.requested_memory(GB10_TOTAL, 0.82)
    assert need == -(-GB10_TOTAL * 82 // 100)
    assert vllm_guard.refusal(need, GB10_TOTAL, 0.82) is None
    assert vllm_guard.refusal(need - 1, GB10_TOTAL, 0.82) is not None


def test_highest_utilization_rounds_down_to_two_decimals():
    assert vllm_guard.highest_utilization(85 * GIB, 100 * GIB) == 0.83  # exactly 0.85 − 0.02
    assert vllm_guard.highest_utilization(85 * GIB - 1, 100 * GIB) == 0.82
    assert vllm_guard.highest_utilization(10 * GIB, 100 * GIB, margin=0.1) == 0.0


def test_offline_figures_are_a_gb10_with_caches_dropped():
    case = json.loads((ROOT / "tests" / "facts_cases" / "meminfo_gb10_caches_dropped.json").read_text())
    assert plan.GB10_MEM_AVAILABLE == case["fact"]["available"]
    assert abs(plan.GB10_MEM_TOTAL - case["fact"]["total"]) < 2 << 20  # docs/architecture.md, "The GB10's memory": ≈ 127,600,000 kB


def test_default_utilization_is_refused_on_a_gb10():
    """Seed 000: "above ~0.82 is refused" -- the keys profiles, which passed none, were."""
    free = plan.GB10_MEM_AVAILABLE - RUNTIME
    assert vllm_guard.refusal(free, plan.GB10_MEM_TOTAL, vllm_guard.DEFAULT_UTILIZATION)
    assert vllm_guard.highest_utilization(free, plan.GB10_MEM_TOTAL) == 0.82
    assert vllm_guard.refusal(free, plan.GB10_MEM_TOTAL, 0.82) is None


def mem(*available_gib):
    return {r: (GB10_TOTAL, int(a * GIB)) for r, a in enumerate(available_gib)}


def test_the_tightest_rank_sets_the_planned_utilization():
    guard = vllm_guard.choose(mem(117, 110, 116), RUNTIME)
    # rank 1: (110 − 14) / 121.69 − 0.02 = 0.7689
    assert (guard.utilization, guard.source, guard.highest, guard.note) == (0.76, "plan", 0.76, "")
    assert [g.highest for g in guard.ranks] == [0.82, 0.76, 0.81]
    assert not guard.refused and all(g.utilization == 0.76 for g in guard.ranks)


def test_a_profile_value_is_kept_when_it_clears_else_lowered_with_the_reason():
    kept = vllm_guard.choose(mem(117, 117), RUNTIME, given=0.8, given_by="profile", profile="p")
    assert (kept.utilization, kept.source, kept.note) == (0.8, "profile", "")
    lowered = vllm_guard.choose(mem(117, 112), RUNTIME, given=0.84, given_by="profile", profile="p")
    assert (lowered.utilization, lowered.source) == (0.78, "plan")
    assert lowered.note == ("profile p's --gpu-memory-utilization 0.84 lowered to 0.78: rank 1: "
                            "(MemAvailable 112.0 − runtime 14.0) / MemTotal 121.7 GiB − margin 0.02 = 0.7853")


def test_the_users_value_is_kept_even_when_refused():
    guard = vllm_guard.choose(mem(117, 100), RUNTIME, given=0.8, given_by="config")
    assert guard.utilization == 0.8 and guard.source == "config"
    assert [g.rank for g in guard.refused] == [1]
    assert guard.refused[0].refusal.startswith("Free memory on device cuda:0 (86.0/121.69 GiB)")
    assert guard.note.startswith("cluster.yaml's --gpu-memory-utilization 0.8 is refused by vLLM's "
                                 "guard on rank 1 (`check` fails, `up` starts nothing); use ≤ 0.68")


def test_nothing_clears_when_the_runtime_takes_it_all():
    guard = vllm_guard.choose(mem(117, 15), RUNTIME)
    assert guard.utilization is None and guard.note.startswith(
        "no --gpu-memory-utilization clears vLLM's guard: rank 1: (MemAvailable 15.0 − runtime 14.0)")


@pytest.mark.parametrize("available_gib,sign", [(117.1, "≥"), (100, "<")])
def test_rank_explains_its_arithmetic(available_gib, sign):
    g = vllm_guard.RankGuard(0, GB10_TOTAL, int(available_gib * GIB), RUNTIME, 0.82, 0.02)
    assert g.explain() == (f"free {available_gib - 14:.1f} GiB (MemAvailable {available_gib:.1f} − runtime "
                           f"14.0) {sign} MemTotal 121.7 GiB × 0.82 = 99.8 GiB")
