import hashlib
import json

import pytest

from launcher.inputs import vllm_flags
from launcher.inputs.vllm_flags import Flag, FlagError, parse, split_lines

# The project's shared/vllm/serve-flags-0.33.json (vLLM 0.33.0's own parser: option -> dest, nargs,
# choices, type), which a clone does not have, by the digest of its content: its options in order,
# each spec's keys sorted. To check it again, with SHARED the shared folder:
#   python3 -c 'import hashlib, json; t = json.load(open("SHARED/vllm/serve-flags-0.33.json"));
#   print(hashlib.sha256(json.dumps(list(t.items()), sort_keys=True).encode()).hexdigest())'
SHARED_TABLE_SHA256 = "76e1d62afbb8c2e08ddaf11aa6c6cb83f11c65b3f02a186ac41f156fa1acdf9a"


def digest(table: dict) -> str:
    return hashlib.sha256(json.dumps(list(table.items()), sort_keys=True).encode()).hexdigest()


def test_vendored_table_is_the_shared_one_plus_value_parsers():
    """Every option and every field of the shared table, unchanged and in its order; only "value"
    is added."""
    ours = vllm_flags.table()
    for option, spec in ours.items():
        assert set(spec) == {"dest", "nargs", "choices", "type", "value"}, option
    theirs = {option: {k: v for k, v in spec.items() if k != "value"} for option, spec in ours.items()}
    assert digest(theirs) == SHARED_TABLE_SHA256
    # the digest sees every field: a changed choice, type or order is another table
    changed = {**theirs, "--max-model-len": {**theirs["--max-model-len"], "nargs": "?"}}
    assert digest(changed) != SHARED_TABLE_SHA256
    assert digest(dict(reversed(theirs.items()))) != SHARED_TABLE_SHA256


def test_value_parsers_agree_with_the_table():
    for option, spec in vllm_flags.table().items():
        value = spec["value"]
        assert option in value["argument"].split("/"), option
        assert (value["kind"] in ("switch", "help")) == (spec["nargs"] == "0"), option
        real_choices = value.get("choices")
        assert spec["choices"] == (None if real_choices is None else [str(c) for c in real_choices])
        assert spec["type"] != "_optional_type" or value["wrap"] == "optional_type", option


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
    # values, converted by each option's own vLLM parser
    (["--max-num-seqs", "abc"], "--max-num-seqs: invalid int value 'abc'"),
    (["--max-num-seqs", "1.5"], "--max-num-seqs: invalid int value '1.5'"),
    (["--kv-cache-memory-bytes", "banana"],
     "--kv-cache-memory-bytes: Value banana cannot be converted to <function human_readable_int"),
    (["--max-model-len", "1.5K"], "Decimals are not allowed with binary suffixes like K"),
    (["--gpu-memory-utilization", "high"], "invalid float value 'high'"),
    (["--speculative-config", "{bad"], "Value {bad cannot be converted to <function loads"),
    (["--compilation-config.pass_config.fuse_allreduce_rmz=true"],
     "pass_config.fuse_allreduce_rmz\n  Unexpected keyword argument"),
    (["--dcp-comm-backend", "bogus"], "--dcp-comm-backend: 'bogus' is not one of a2a, ag_rs, None"),
])
def test_refused_like_vllm_would(tokens, message):
    with pytest.raises(FlagError, match=message.replace("?", r"\?")):
        parse(tokens)


@pytest.mark.parametrize("tokens", [
    ["--moe-backend", "Marlin"], ["--dcp-comm-backend", "None"], ["--kv-cache-memory-bytes", "13G"],
    ["--max-model-len", "auto"], ["--compilation-config.max_cudagraph_capture_size", "8k"],
    ["--distributed-executor-backend", "rya"],  # vLLM's parser takes any string (a class name)
])
def test_values_vllm_takes(tokens):
    assert vllm_flags.render(parse(tokens)) == tokens


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
