import pytest

from conftest import SHARED
from launcher import vllm_flags
from launcher.vllm_flags import Flag, FlagError, parse, split_lines


def test_vendored_table_is_the_shared_one():
    shared = SHARED / "vllm" / "serve-flags-0.33.json"
    if not shared.exists():
        pytest.skip("no ../shared beside this checkout")
    assert vllm_flags.FLAGS_FILE.read_bytes() == shared.read_bytes()


def test_seed_001_key_settings_parse_into_their_flags():
    line = ("--kv-cache-dtype fp8 --max-model-len 200000 --max-num-seqs 8 --kv-cache-memory-bytes "
            "14092861440 --async-scheduling --compilation-config.pass_config.fuse_allreduce_rms=true "
            "--cudagraph-capture-sizes 1 2 3 4 6 8 12 24 --speculative-config "
            "'{\"method\":\"mtp\",\"num_speculative_tokens\":2}'")
    flags = parse(split_lines([line]))
    assert [f.name for f in flags] == [
        "--kv-cache-dtype", "--max-model-len", "--max-num-seqs", "--kv-cache-memory-bytes",
        "--async-scheduling", "--compilation-config.pass_config.fuse_allreduce_rms",
        "--cudagraph-capture-sizes", "--speculative-config"]
    assert flags[6].values == ("1", "2", "3", "4", "6", "8", "12", "24")
    assert flags[4].values == ()
    assert flags[7].values == ('{"method":"mtp","num_speculative_tokens":2}',)
    # rendering gives back the same tokens, `=` form included
    assert vllm_flags.render(flags) == split_lines([line])


@pytest.mark.parametrize("tokens, message", [
    (["--max-model-length", "1000"], "did you mean --max-model-len?"),
    (["--kv-cache-dtpye", "fp8"], "did you mean --kv-cache-dtype?"),
    (["--async-scheduling=yes"], "is a switch"),
    (["--max-model-len"], "expects a value"),
    (["fp8"], "every argument must follow a flag"),
    (["--max-model-len.foo=1"], "unrecognized"),  # sub-keys only on dict-typed options
    (["--all2all-backend", "bogus"], "is not one of"),
])
def test_refused_like_vllm_would(tokens, message):
    with pytest.raises(FlagError, match=message.replace("?", r"\?")):
        parse(tokens)


def test_plugin_flags_pass_when_declared():
    with pytest.raises(FlagError):
        parse(["--exl3-codebook", "mul1"])
    assert parse(["--exl3-codebook", "mul1"], frozenset({"--exl3-codebook"}))[0].plugin


def test_merge_replaces_by_dest_in_place_and_appends_new():
    base = parse(["--tensor-parallel-size", "4", "--max-model-len", "1000"])
    merged = vllm_flags.merge(base, parse(["-tp", "2", "--max-num-seqs", "4"]))
    assert vllm_flags.render(merged) == ["-tp", "2", "--max-model-len", "1000", "--max-num-seqs", "4"]
    assert vllm_flags.value(merged, "tensor_parallel_size") == "2"
    assert Flag("--headless").key == "headless"


def test_negative_numbers_are_values_not_flags():
    assert parse(["--seed", "-1"])[0].values == ("-1",)
