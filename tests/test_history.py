"""The deploy history as data: what an entry keeps, what `rollback` picks, the file's bounds, and
which rank `rollback` refuses (launcher/apply/history.py, launcher/apply/upgrade.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from launcher.apply import history, upgrade
from launcher.plan.cluster_plan import Plan, RankPlan

KEY = "sk-sparkstack-0123456789abcdef"


def plan(image="sparkstack/keys:aaa", tag="x") -> Plan:
    ranks = [RankPlan(r, f"spark{r + 1}", {"VLLM_API_KEY": KEY, "NCCL_ALGO": "Ring", "TAG": tag},
                      ["docker", "run", "-d", "--name", "sparkstack-engine", image],
                      ["vllm", "serve", "/models/m", "--api-key", KEY, "--node-rank", str(r)])
             for r in range(4)]
    return Plan(ranks, None, image)


def entry(id_, outcome=history.SERVING, image="sparkstack/keys:aaa", tag="x", profile="sandbox") -> history.Entry:
    e = history.entry_for(profile, plan(image, tag), {r: f"sha256:{image[-3:]}{r}" for r in range(4)},
                          {r: "fp0123456789abcdef" for r in range(4)}, how="up", outcome=outcome,
                          at="2026-12-02T01:00:00+00:00")
    e.id = id_
    return e


def test_an_entry_keeps_what_was_deployed_and_no_secret():
    e = entry(1)
    d = e.to_json()
    assert d["profile"] == "sandbox" and d["image"] == "sparkstack/keys:aaa"
    assert [r["image_id"] for r in d["ranks"]] == ["sha256:aaa0", "sha256:aaa1", "sha256:aaa2", "sha256:aaa3"]
    assert {r["checkpoint"] for r in d["ranks"]} == {"fp0123456789abcdef"}
    assert d["ranks"][2]["engine"] == ["vllm", "serve", "/models/m", "--api-key", "***", "--node-rank", "2"]
    assert len(d["ranks"][0]["env_hash"]) == 16 and len(d["ranks"][0]["plan_hash"]) == 16
    assert d["verify"] == {"status": "not available"}
    assert KEY not in json.dumps(d)
    # another environment is another hash, and so another deploy
    assert entry(2, tag="y").ranks[0].env_hash != e.ranks[0].env_hash
    assert not entry(2, tag="y").same_deploy(e) and entry(2).same_deploy(e)
    assert history.Entry.from_json(json.loads(json.dumps(d))) == e


def test_a_verification_is_kept_with_its_figures():
    passed = SimpleNamespace(ok=True, figures={"ppl_prose": 3.6}, message="")
    failed = SimpleNamespace(ok=False, to_json=lambda: {"ppl_prose": 91.0}, message="perplexity 91.0 > 4.3")
    assert history.verdict(None) == {"status": "not available"}
    assert history.verdict(passed) == {"status": "passed", "figures": {"ppl_prose": 3.6}, "message": ""}
    assert history.verdict(failed)["status"] == "failed" and history.verdict(failed)["figures"] == {"ppl_prose": 91.0}


def running(e: history.Entry) -> dict:
    return {r.rank: r.plan_hash for r in e.ranks}


def test_rollback_picks_the_last_good_deploy_before_the_current():
    a, b = entry(1), entry(2, image="sparkstack/keys:bbb", tag="b")
    assert history.pick([a, b], running(b)) is a
    # a re-`up` of b (the same deploy) is skipped: the one before is a
    b2 = entry(3, image="sparkstack/keys:bbb", tag="b")
    assert history.pick([a, b, b2], running(b)) is a


def test_after_a_failed_upgrade_rolled_back_there_is_nothing_before():
    a = entry(1)
    failed = entry(2, outcome=history.FAILED, image="sparkstack/keys:bad", tag="bad")
    back = entry(3)  # the rollback: a again
    with pytest.raises(history.NoTarget, match="no good deploy before entry 3"):
        history.pick([a, failed, back], running(back))
    # by hand, to a named entry; a failed one is refused
    assert history.pick([a, failed, back], running(back), "#1") is a
    with pytest.raises(history.NoTarget, match="entry 2 never served"):
        history.pick([a, failed, back], running(back), "2")
    with pytest.raises(history.NoTarget, match="history has no entry 9"):
        history.pick([a, failed, back], running(back), "9")


def test_nothing_running_goes_back_from_the_newest_good():
    a, b = entry(1), entry(2, image="sparkstack/keys:bbb", tag="b")
    assert history.pick([a, b], {0: None, 1: None, 2: None, 3: None}) is a
    with pytest.raises(history.NoTarget, match="history is empty"):
        history.pick([], {})


def test_the_file_is_bounded_and_numbered(tmp_path):
    path = tmp_path / "h" / "10.0.0.1.json"
    for _ in range(7):
        history.add(path, entry(0), limit=5)
    kept = history.load(path)
    assert [e.id for e in kept] == [3, 4, 5, 6, 7]
    assert not list(path.parent.glob("*.tmp"))  # written by rename: no temp file left
    path.write_text("{not json")
    with pytest.raises(history.SparkstackError, match="not a deploy history the kit wrote"):
        history.load(path)


def test_rollback_names_the_rank_that_no_longer_has_the_image():
    e = entry(4)
    t = [SimpleNamespace(rank=r, name=f"rank {r} (spark{r + 1})") for r in range(4)]
    found = [(t[0], {e.image: "sha256:aaa0"}, None), (t[1], {e.image: "sha256:aaa1"}, None),
             (t[2], {}, None), (t[3], {e.image: "sha256:other"}, None)]
    problems = upgrade.image_problems(e, found)
    assert len(problems) == 2
    assert problems[0].startswith("rank 2 (spark3): no longer has image aaa2 of entry 4 "
                                  "(it no longer has sparkstack/keys:aaa); fix: ")
    assert "sparkstack ship --profile sandbox" in problems[0]
    assert "(sparkstack/keys:aaa is other there)" in problems[1]
    assert upgrade.image_problems(e, found[:2]) == []
