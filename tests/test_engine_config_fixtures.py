"""The sandbox stand-in's engine configuration says what REAL vLLM 0.33 said (issue 32).

tests/fixtures/vllm033_engine_config/*.json were recorded by running real vLLM 0.33.0 on a CPU
machine with a GB10's device figures (scripts/check_engine_config_with_vllm.py --record; each
file names the command and what was faked): per argv, the kit's planned rank-0 argv of every vLLM
profile on its image and the argvs the kit used to plan, vLLM's verdict, its message verbatim, and
the warnings it logged. No vLLM is needed here: the stand-in is asked the same questions, and
the plan's notes are held against the recorded warnings."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli.commands import main
from launcher.inputs import vllm_flags
from launcher.onrank import engine_config

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "vllm033_engine_config"
STANDINS = ROOT / "launcher" / "sandbox" / "standins"
RECORDED = sorted(FIXTURES.glob("*.json"))
ASK = """
import json, sys
import standin_vllm
code, lines = standin_vllm.validate(json.loads(sys.argv[1]))
print("RESULT " + json.dumps({"code": code, "message": "\\n".join(lines)}))
"""


def recorded(path: Path) -> dict:
    return json.loads(path.read_text())


def checkpoint(where: str, tmp_path: Path) -> Path:
    """The recorded checkpoint (config.json only), or the same with its quantization only in a
    quantization_config.json beside it (the script's "sidecar"), or with 2 attention heads
    ("two-heads")."""
    folder = tmp_path / where
    folder.mkdir()
    cfg = json.loads((FIXTURES / "checkpoint" / "config.json").read_text())
    if where == "sidecar":
        (folder / "quantization_config.json").write_text(json.dumps(cfg.pop("quantization_config")))
    if where == "two-heads":
        cfg.update(num_attention_heads=2, num_key_value_heads=2)
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    return folder


def standin(case: dict, tmp_path: Path) -> dict:
    """standin_vllm.validate in a python without site-packages, its image registering what the
    recorded image registered (SANDBOX_REGISTERS in a file of its `vllm` package)."""
    image = tmp_path / "image" / "vllm"
    image.mkdir(parents=True)
    (image / "registers.py").write_text(f"SANDBOX_REGISTERS = {case['registers']!r}\n")
    model = checkpoint(case["checkpoint"], tmp_path)
    env = {"PATH": os.environ.get("PATH", ""), "SANDBOX_VLLM_FLAGS": str(vllm_flags.FLAGS_FILE),
           "PYTHONPATH": os.pathsep.join([str(STANDINS), str(image.parent)]), **case["env"]}
    done = subprocess.run([sys.executable, "-S", "-c", ASK, json.dumps([str(model), *case["argv"]])],
                          env=env, capture_output=True, text=True, timeout=60)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, done.stderr
    return json.loads(line[7:])


def test_the_recordings_are_there_and_name_how_they_were_made():
    names = {p.stem for p in RECORDED}
    assert {"old-1m-without-override", "old-exl3-without-plugin", "old-dcp-without-backend",
            "old-custom-unregistered", "old-ray-without-ray", "keys-1m-dcp4-native"} <= names
    for path in RECORDED:
        case = recorded(path)
        assert case["vllm"] == "0.33.0" and "check_engine_config_with_vllm.py" in case["command"]


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_the_standin_answers_as_vllm_did(path, tmp_path):
    case = recorded(path)
    answer = standin(case, tmp_path)
    assert ("OK" if answer["code"] == 0 else "FAIL") == case["verdict"], answer
    if case["verdict"] == "FAIL":  # vLLM's words, verbatim (an OK summary is the stand-in's own)
        assert answer["message"] == case["message"]


MTP = ("max_num_scheduled_tokens is set to", "num_speculative_tokens > 1")


@pytest.mark.parametrize("path", [p for p in RECORDED if p.stem.endswith("-native")], ids=lambda p: p.stem)
def test_the_plan_says_the_speculative_warnings_vllm_logged(path, write_config):
    """Each MTP warning vLLM logged for a profile's argv is in that profile's plan notes,
    verbatim; and the plan announces none that vLLM did not log."""
    case = recorded(path)
    profile = path.stem[:-len("-native")]
    result = CliRunner().invoke(main, ["plan", "-c", str(write_config(lambda d: d.update(profile=profile))),
                                       "--offline", "--json"])
    assert result.exit_code == 0, result.output
    notes = [n for n in json.loads(result.output)["notes"] if n.startswith("vLLM 0.33 warns at start")]
    logged = [w for w in case["warnings"] if w.startswith(MTP) or w.startswith("Enabling " + MTP[1])]
    assert logged, "every vLLM profile runs MTP: vLLM warned"
    assert sorted(re.search(r': "(.*)"$', n).group(1) for n in notes) == sorted(logged)


def test_a_refusal_is_vllms_own_error_not_pydantics_wrapping():
    """vLLM's configs are pydantic dataclasses: a ValueError in their validation arrives as
    pydantic's ValidationError ("1 validation error for ModelConfig ... [type=value_error, ...");
    the row says the ValueError vLLM raised (what the recordings and the stand-in say)."""
    pydantic = pytest.importorskip("pydantic")

    @pydantic.dataclasses.dataclass
    class ModelConfig:
        max_model_len: int

        def __post_init__(self):
            raise ValueError(f"User-specified max_model_len ({self.max_model_len}) is greater ...")

    with pytest.raises(Exception) as caught:
        ModelConfig(max_model_len=1000000)
    assert "1 validation error for ModelConfig" in str(caught.value)
    said = engine_config.refusal(caught.value)
    assert said == "ValueError: User-specified max_model_len (1000000) is greater ..."
    assert engine_config.refusal(RuntimeError("plain")) == "RuntimeError: plain"
