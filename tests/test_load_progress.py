"""`up` and `wait` show how far each rank's engine has read its checkpoint (issue 15): the
engine processes' read_bytes against the bytes it will read and the cold-load estimate, and `up`
says when the estimate makes it wait longer than --timeout."""

from types import SimpleNamespace

from launcher.apply import load_progress
from launcher.facts.load_path import LoadPath

GB = 10**9
# `cat /proc/[0-9]*/io` in a serving container: the API server, a worker, and `sh` itself
IO = """rchar: 9120
wchar: 0
syscr: 12
syscw: 0
read_bytes: 1500000000
write_bytes: 0
cancelled_write_bytes: 0
rchar: 40960
wchar: 512
syscr: 40
syscw: 2
read_bytes: 500000000
write_bytes: 4096
cancelled_write_bytes: 0
rchar: 300
read_bytes: 0
"""


def path(r: int, gb: float = 4, mbps: int = 10_000, sharing: int = 4) -> LoadPath:
    return LoadPath(r, "network", int(gb * GB), "10.0.0.5:/models", "10.0.0.5", "enP7s7", mbps, sharing=sharing)


def test_read_bytes_are_summed_over_the_containers_processes_not_rchar():
    assert load_progress.parse(IO) == 2 * GB
    assert load_progress.parse("") is None and load_progress.parse("Error: No such container") is None


def test_the_line_names_each_rank_its_share_and_the_estimate():
    paths = {0: path(0), 1: path(1)}  # 4 GB at 10G x 0.8 / 4 ranks (0.25 GB/s): 16 s
    line = load_progress.describe({0: 2 * GB, 1: None}, paths, 6.0)
    assert line == ("  checkpoint read (engine read_bytes): rank 0 2.00 GB (50%), rank 1 ? of 4.00 GB each; "
                    "6 s of the ~16 s cold-load estimate")
    assert "(no estimate)" in load_progress.describe({0: GB}, {}, 3.0)


class FakeGroup:
    def __init__(self, outputs):
        self.outputs, self.calls = outputs, 0

    def run(self, command, timeout):
        assert "read_bytes" not in command and "/proc/[0-9]*/io" in command
        out = self.outputs[min(self.calls, len(self.outputs) - 1)]
        self.calls += 1
        return SimpleNamespace(results=[SimpleNamespace(target=SimpleNamespace(rank=r), ok=True, stdout=o)
                                        for r, o in enumerate(out)])


def test_progress_speaks_every_interval_until_every_rank_has_read_its_bytes():
    said = []
    group = FakeGroup([["read_bytes: 1000000000\n"], ["read_bytes: 4000000000\n"]])
    p = load_progress.Progress(group, {0: path(0)}, said.append, interval=0)
    for _ in range(4):
        p()
    assert group.calls == 2  # done after the rank read its 4 GB: no more probing
    assert "rank 0 1.00 GB (25%)" in said[0] and "rank 0 4.00 GB (100%)" in said[1]


def test_up_says_why_it_waits_longer_than_its_timeout():
    paths = {0: path(0, gb=300), 1: path(1, gb=300)}  # 300 GB / (1.25 GB/s x 0.8 / 4) = 1200 s
    said = load_progress.extended(paths, 900)
    assert said.startswith("waiting up to 40.0 min for the API (not --timeout's 900 s): the cold-load estimate of rank 0, ")
    assert "300.0 GB from 10.0.0.5:/models over enP7s7 (10 Gb/s, the server's port shared by 4 ranks): ~20.0 min cold" in said
    assert said.endswith("times 2")
    assert load_progress.extended({0: path(0, gb=4)}, 900) is None  # the estimate fits in --timeout
