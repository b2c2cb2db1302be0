"""tools/depth_report.py: the engine-side depth report (accuracy, perplexity, early exit per L).

The end-to-end test runs it on the bundled model with tiny settings: that model speaks
English, not arithmetic, so its accuracy is about 0; what is checked is that every number
comes out, in range, and the three pictures are real PNGs."""
import importlib.util
import json
import os
import struct
import subprocess
import sys

import pytest

import tinyloop_py as tl

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "tools", "depth_report.py")
MODEL = os.path.join(ROOT, "models", "tinyloop-demo.tinyloop")
CORPUS = os.path.abspath(os.path.join(ROOT, "..", "shared", "data", "corpus"))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def load_script():
    spec = importlib.util.spec_from_file_location("depth_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


dr = load_script()


@pytest.mark.parametrize("completion, answer, right", [
    ("05198\n", "05198", True),
    ("05198\n\n", "05198", True),      # a tokenizer that merges newlines
    ("05198", "05198", False),         # cut by max_tokens before the newline
    ("0519\n", "05198", False),        # too short
    ("051980\n", "05198", False),      # too long
    ("05198x\n", "05198", False),      # junk after the answer
    ("05198 \n", "05198", False),
    (" 05198\n", "05198", False),      # a space before it
    ("05199\n", "05198", False),       # one digit wrong
    ("\n05198\n", "05198", False),     # the answer after the line ends
    ("", "05198", False),
])
def test_exact_match(completion, answer, right):
    assert dr.exact_match(completion, answer) is right


@pytest.mark.parametrize("prompt, chain", [
    ("0000+0000=", 0), ("0005+0005=", 1), ("4887+7714=", 4), ("0095+0005=", 2), ("9+1=", 1), ("99+1=", 2)])
def test_longest_carry_chain(prompt, chain):
    assert dr.longest_carry_chain(prompt) == chain


def test_exit_setting_parsing():
    assert dr.parse_exit_setting("patience=2,tau=0.01,min_L=3") == {
        "early_exit_patience": 2, "early_exit_tau": 0.01, "early_exit_min_L": 3}
    assert dr.parse_exit_setting("patience=1,margin=3") == {
        "early_exit_patience": 1, "early_exit_logit_margin": 3.0}
    with pytest.raises(ValueError, match="speed"):
        dr.parse_exit_setting("patience=1,speed=2")
    with pytest.raises(ValueError, match="tau must be a number"):
        dr.parse_exit_setting("patience=1,tau=fast")
    with pytest.raises(ValueError, match="patience >= 1"):
        dr.parse_exit_setting("tau=0.1")
    with pytest.raises(ValueError, match="--depths"):
        dr.parse_depths("1,0")


def test_example_choice():
    problems = [("1+1=", "2"), ("9+1=", "10"), ("99+1=", "100")]
    chains = [dr.longest_carry_chain(p) for p, _ in problems]
    assert dr.pick_example(problems, chains, None) == 2          # the longest chain first
    assert dr.pick_example(problems, chains, "9+1=") == 1
    assert dr.pick_example(problems, chains, "0") == 0
    with pytest.raises(ValueError, match="out of range"):
        dr.pick_example(problems, chains, "3")
    with pytest.raises(ValueError, match="neither an index"):
        dr.pick_example(problems, chains, "5+5=")


def png_size(path):
    """(width, height) of a PNG file, after checking its signature and IHDR chunk."""
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


@pytest.mark.skipif(not os.path.isdir(CORPUS), reason="shared/data/corpus not present")
def test_report_on_the_bundled_model(tmp_path):
    out_json = tmp_path / "report.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"),
                                                        os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--model", MODEL, "--n", "8", "--depths", "1,2", "--max-windows", "2",
         "--ctx", "64", "--out-dir", str(tmp_path / "img"), "--json", str(out_json)],
        capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("depth-accuracy.png", "depth-perplexity.png", "depth-early-exit.png"):
        width, height = png_size(tmp_path / "img" / name)
        assert width >= 300 and height >= 200

    report = json.loads(out_json.read_text())
    assert report["depths"] == [1, 2] and report["task"]["n"] == 8
    for L in ("1", "2"):
        assert 0.0 <= report["accuracy"][L] <= 1.0
        assert report["perplexity"]["by_loops"][L] > 1.0
    assert report["perplexity"]["windows"] == 2

    with tl.Model(MODEL) as model:
        default_loops = model.config()["default_loops"]  # the sweep's depth when --exit-loops is not given
    sweep = report["early_exit"]
    assert sweep["loops"] == default_loops
    assert sweep["settings"][0]["setting"] == "off" and sweep["settings"][0]["mean_loops"] == default_loops
    assert len(sweep["settings"]) == 1 + len(dr.DEFAULT_EXIT_SETTINGS)
    for row in sweep["settings"]:
        assert 0.0 <= row["accuracy"] <= 1.0
        assert 1.0 <= row["mean_loops"] <= default_loops
    # hidden-L2 at tau 0.05 stops this model's decode steps early (docs/loop-depth.md, "Cost")
    assert min(row["mean_decode_loops"] for row in sweep["settings"]) < default_loops

    example = report["example"]
    assert example["prompt"].endswith("=") and example["longest_carry_chain"] >= 1
    for run in example["runs"]:
        assert len(run["loops"]) == len(run["tokens"]) == len(run["token_labels"]) >= 1
        assert run["loops"][0] == default_loops  # the first token comes from the prefill at full depth
        assert all(1 <= x <= default_loops for x in run["loops"])

    # the markdown tables for docs/bundled-model.md
    assert "| all | 8 |" in proc.stdout and "| patience=1,tau=0.05 |" in proc.stdout
