"""The whole test run's `exatrain run` output, scanned (issue 24: "a stderr scan of the whole test run's
`exatrain run` invocations finds no FutureWarning and no mixed lines").

`tests/conftest.py`'s `run_exatrain` and `finish` hand every `exatrain run` invocation's stdout and stderr
to `record`; at the end of the session the findings (a FutureWarning; a rank label inside a line, where
another rank's output broke in) are printed and turn the run red. Under pytest-xdist each worker sends its
findings to the controller, which decides. Invocations made otherwise (inside SLURM jobs, by the site
guides' shell blocks) are not scanned.
"""

from __future__ import annotations

import os
import re

# A rank label (`--label`: "[rank N] ") anywhere but at the start of a line, except after exatrain's own
# "exatrain: " prefix (its per-rank notes): another rank's output broke into this line.
_LABEL_INSIDE = re.compile(r"(?<!^)(?<!exatrain: )\[rank \d+\] ")
_KEY = "exatrain_run_scan"
# FutureWarnings that third-party code the test's script calls raises itself, exactly as under plain torchrun
# (not exatrain's: the scan is for warnings exatrain causes). Each with where it comes from.
THIRD_PARTY = {
    # DeepSpeed's comm layer (deepspeed/comm/torch.py) calls torch.distributed.all_gather_into_tensor, which
    # torch 2.13 deprecates (distributed_c10d.py); tests/e2e/test_deepspeed_own.py runs a user's DeepSpeed
    # script
    "`torch.distributed.all_gather_into_tensor` is deprecated": "DeepSpeed's call (deepspeed/comm/torch.py)",
}
_findings: list[str] = []


def findings(stdout: str, stderr: str) -> list[str]:
    """The lines of one invocation's output that the scan rejects, each with what is wrong with it."""
    found = []
    for stream, text in (("stdout", stdout), ("stderr", stderr)):
        for line in text.splitlines():
            if "FutureWarning" in line and not any(known in line for known in THIRD_PARTY):
                found.append(f"{stream}: FutureWarning: {line[:300]}")
            elif _LABEL_INSIDE.search(line):
                found.append(f"{stream}: a rank's label inside a line (mixed output): {line[:300]}")
    return found


def record(args, stdout: str | None, stderr: str | None) -> None:
    """Scan one invocation of the CLI if it was `exatrain run`; remember what it found, with the test."""
    if not args or args[0] != "run":
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
    _findings.extend(f"{test}: {f}" for f in findings(stdout or "", stderr or ""))


def pytest_sessionfinish(session, exitstatus):
    """Workers hand their findings over; the controller (or a run without xdist) reports and fails."""
    config = session.config
    if hasattr(config, "workeroutput"):  # an xdist worker
        config.workeroutput[_KEY] = list(_findings)
        return
    collected = _findings + getattr(config, "_exatrain_run_scan", [])
    if collected:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write("\n")
            reporter.section("exatrain run output scan: FAILED", sep="=", red=True)
            for line in collected:
                reporter.write_line(line)
        session.exitstatus = 1


def pytest_testnodedown(node, error):
    """The controller keeps what a worker found (xdist's hook, called as each worker ends)."""
    found = getattr(node, "workeroutput", {}).get(_KEY, [])
    config = node.config
    config._exatrain_run_scan = getattr(config, "_exatrain_run_scan", []) + list(found)
