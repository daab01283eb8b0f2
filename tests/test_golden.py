"""tests/golden.py: `--update-golden` rewrites a golden file that differs and fails that test;
without the option a difference fails and the file is left alone."""

import pytest

from golden import Golden


def test_a_rewrite_fails_and_an_unchanged_file_passes(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("old\n")
    with pytest.raises(pytest.fail.Exception, match=f"golden rewritten: {path}, review the diff and re-run"):
        Golden(update=True).check(path, "new\n")
    assert path.read_text() == "new\n"
    Golden(update=True).check(path, "new\n")  # unchanged: passes
    Golden(update=False).check(path, "new\n")


def test_without_the_option_a_difference_fails_and_nothing_is_written(tmp_path):
    (tmp_path / "a.Dockerfile").write_text("FROM a\n")
    (tmp_path / "stale.Dockerfile").write_text("FROM s\n")
    with pytest.raises(AssertionError):
        Golden(update=False).check(tmp_path / "a.Dockerfile", "FROM b\n")
    with pytest.raises(AssertionError):  # a golden file no stage renders any more
        Golden(update=False).check_dir(tmp_path, {"a.Dockerfile": "FROM a\n"}, pattern="*.Dockerfile")
    assert (tmp_path / "a.Dockerfile").read_text() == "FROM a\n" and (tmp_path / "stale.Dockerfile").exists()
    with pytest.raises(pytest.fail.Exception, match="stale.Dockerfile"):
        Golden(update=True).check_dir(tmp_path, {"a.Dockerfile": "FROM a\n"}, pattern="*.Dockerfile")
    assert not (tmp_path / "stale.Dockerfile").exists()
