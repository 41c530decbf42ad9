"""``gpushare demo`` fails fast and says why: a bad flag before anything starts, a dying component with its log."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpushare.localcluster.demo import run_demo
from gpushare.policies import policy_names

GPUSHARE = Path(sys.executable).parent / "gpushare"


def test_unknown_policy_is_refused_at_once_with_the_allowed_names(tmp_path: Path) -> None:
    started = time.monotonic()
    result = subprocess.run([str(GPUSHARE), "demo", "--policy", "bogus", "--workdir", str(tmp_path / "demo")],
                            capture_output=True, text=True, timeout=60, check=False)
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert elapsed < 5, f"took {elapsed:.1f} s"
    assert "--policy 'bogus' is not a placement policy" in result.stderr
    assert ", ".join(policy_names()) in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "demo").exists(), "nothing should start, not even the work folder"


def test_a_component_that_dies_is_reported_with_the_end_of_its_log(tmp_path: Path) -> None:
    # run_demo itself does not validate the policy, so the extender process gets it and exits.
    started = time.monotonic()
    with pytest.raises(RuntimeError) as caught:
        run_demo(tmp_path, "bogus")
    message = str(caught.value)
    assert "extender exited with code 2 while the demo waited for the extender to be ready" in message
    assert f"last lines of {tmp_path / 'extender.log'}" in message
    assert "Unknown placement policy 'bogus'" in message
    assert time.monotonic() - started < 30


def test_the_demo_runs_end_to_end_with_a_preemption_and_a_gang(tmp_path: Path) -> None:
    result = subprocess.run([str(GPUSHARE), "demo", "--workdir", str(tmp_path / "demo")], capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    out = result.stdout
    landed = out.split("Where each pod landed:")[1].split("What each container received")[0]
    rows = {line.split()[0]: line.split() for line in landed.splitlines()[3:] if line.strip() and line[0] != " "}
    assert rows["llm-2gpu"][1:4] == ["gpu-node-b", "0,1", "120"]
    assert rows["too-big"][1] == "-"
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=61440m" in out
    act = out.split("Preemption:")[1]
    # The only lower-priority pod whose eviction frees a whole A100 alone is llm-2gpu (priority 0, two GPUs).
    preempted = [line.split()[0] for line in act.splitlines() if " Preempted " in line]
    assert preempted == ["llm-2gpu"]
    assert re.search(r"urgent-finetune\s+Running\s+on gpu-node-b, GPU\(s\) [0-3], 80 GiB", act)
    assert "kubectl inspect gpushare" in act
    gang = out.split("Gang: PodGroup train (minMember 3)")[1]
    assert "gang default/train: 2 of 3 members exist; waiting for 1 more" in " ".join(gang.split())
    assert len(re.findall(r"train-[0-2]\s+Running\s+on gpu-node-", gang)) == 3
