"""scripts/device_check.sh: its --cpu-smoke mode runs every step end to end, and a failing step fails the script.

The GPU mode itself needs a CUDA device; here it must refuse to run with a clear message. The smoke run costs
about two minutes of CPU time (four interpreters load torch, the zoo and the corpus prompts); on a busy shared
machine its wall time can be many times that, hence the generous timeout.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "device_check.sh"
SECTIONS = ["1. kernel and device tests", "2. kernel vs torch reference throughput", "3. specdec bench, batch 1",
            "4. batched tokens/s, plain vs speculative"]


def run_check(*args: str, python: str = sys.executable, hide_gpu: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": python, "PYTHONPATH": str(ROOT)}
    if hide_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1800)


def test_the_cpu_smoke_mode_runs_every_step():
    result = run_check("--cpu-smoke")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for section in SECTIONS:
        assert f"--- ok: {section}" in result.stdout
    assert "| 2 | 2 | rejection |" in result.stdout and "| yes |" in result.stdout  # kernel table
    batched = result.stdout.split("=== 4.")[1]
    assert "| 2 |" in batched and "batch 2: one target forward over 1 token per sequence" in batched
    assert result.stdout.rstrip().endswith("=== device check passed (cpu)")


def test_a_failing_step_fails_the_script(tmp_path):
    # An interpreter that passes the environment check but fails every later step.
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nif [ \"$1\" = - ]; then exec {sys.executable} \"$@\"; fi\nexit 3\n")
    fake.chmod(0o755)
    result = run_check("--cpu-smoke", python=str(fake))
    assert result.returncode == 1
    verdict = result.stdout.rstrip().splitlines()[-1]
    assert verdict.startswith("=== device check FAILED: ") and all(section in verdict for section in SECTIONS)


def test_the_gpu_mode_refuses_to_run_without_cuda_and_bad_options_are_refused():
    result = run_check(hide_gpu=True)
    assert result.returncode == 1 and "no CUDA device" in result.stderr
    assert run_check("--fast").returncode == 2
