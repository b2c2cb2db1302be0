"""scripts/ctest_skipped.py: the test command's list of C++ cases this CPU could not run."""
from __future__ import annotations

import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
from ctest_skipped import skipped_cases  # noqa: E402

LOG = """[ RUN      ] Vnni.Matches
/src/cpu/matmul_q8act_test.cc:122: Skipped
no AVX512-VNNI on this CPU

[  SKIPPED ] Vnni.Matches (0 ms)
[ RUN      ] Amx.Edges
/src/cpu/matmul_amx_bf16_test.cc:48: Skipped
AMX-BF16 kernel untested: no AMX on this CPU

[  SKIPPED ] Amx.Edges (0 ms)
[ RUN      ] Plain.Works
[       OK ] Plain.Works (0 ms)
[  SKIPPED ] 2 tests, listed below:
[  SKIPPED ] Vnni.Matches
"""


def test_groups_skipped_cases_by_reason():
    assert dict(skipped_cases(LOG)) == {"no AVX512-VNNI on this CPU": ["Vnni.Matches"],
                                        "AMX-BF16 kernel untested: no AMX on this CPU": ["Amx.Edges"]}
    assert dict(skipped_cases("[ RUN      ] A.B\n[       OK ] A.B (0 ms)\n")) == {}


def test_prints_a_visible_block(tmp_path):
    log = tmp_path / "Testing" / "Temporary" / "LastTest.log"
    log.parent.mkdir(parents=True)
    log.write_text(LOG)
    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "ctest_skipped.py")
    out = subprocess.run([sys.executable, script, str(tmp_path)], capture_output=True, text=True, check=True).stdout
    assert "Skipped C++ cases: 2 (NOT tested on this CPU)" in out
    assert "1 x no AVX512-VNNI on this CPU: Vnni.Matches" in out
