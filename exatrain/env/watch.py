"""What a rank's hang watcher needs from its environment: the request of `exatrain run --hang-timeout`
(exatrain's own variables), the rank's place, and the SLURM job's end time.

`exatrain run` passes the request to its workers as variables because an unmodified script has no other
channel; reading them here keeps every read of the process environment in env/.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from exatrain.env._read import read_restart_count

HANG_TIMEOUT_VAR = "EXATRAIN_HANG_TIMEOUT_S"
RUN_DIR_VAR = "EXATRAIN_RUN_DIR"
#: HANG_TIMEOUT_VAR's value for stack dumps without a watcher (`exatrain run` without --hang-timeout)
STACKS_ONLY = "stacks"
#: epoch seconds at which SLURM ends the job (sbatch and srun set it since SLURM 21.08)
JOB_END_VAR = "SLURM_JOB_END_TIME"


@dataclass(frozen=True)
class HangRequest:
    """A watcher asked for from outside the script: timeout, where to write, and this rank's place. Without a
    timeout (`exatrain run`'s default) only the stack dumps are asked for: SIGUSR1 and the collective
    timeout's diagnosis, no watcher."""

    @property
    def watch(self) -> bool:
        """Whether a hang watcher is asked for (else only the stack dumps)."""
        return self.timeout_s is not None

    timeout_s: float | str | None  # seconds, "auto" (derived from the first steps' times), None: no watcher
    run_dir: str
    rank: int
    world_size: int
    attempt: int
    host: str


def hang_request(environ: Mapping[str, str] | None = None) -> HangRequest | None:
    """The request `exatrain run --hang-timeout` left for this process, or None (no watcher asked for)."""
    environ = os.environ if environ is None else environ
    raw = environ.get(HANG_TIMEOUT_VAR, "").strip()
    if not raw:
        return None
    return HangRequest(
        timeout_s=None if raw == STACKS_ONLY else raw if raw == "auto" else float(raw),
        run_dir=environ.get(RUN_DIR_VAR, "") or "runs/default",
        rank=int(environ.get("RANK", "0") or 0),
        world_size=int(environ.get("WORLD_SIZE", "1") or 1),
        attempt=read_restart_count(environ),
        host=socket.gethostname(),
    )


def hang_variables(timeout_s: float | str | None, run_dir: str) -> dict[str, str]:
    """The variables that carry a hang-watch request to the workers (see hang_request); None: stack dumps
    only."""
    if timeout_s is None:
        return {HANG_TIMEOUT_VAR: STACKS_ONLY, RUN_DIR_VAR: run_dir}
    value = timeout_s if isinstance(timeout_s, str) else f"{timeout_s:g}"
    return {HANG_TIMEOUT_VAR: value, RUN_DIR_VAR: run_dir}


def job_end_time(environ: Mapping[str, str] | None = None) -> float | None:
    """Epoch seconds at which the SLURM job is ended, None outside a job (or when SLURM did not say)."""
    environ = os.environ if environ is None else environ
    raw = environ.get(JOB_END_VAR, "").strip()
    try:
        return float(raw) if raw else None
    except ValueError:
        return None


def node_name(environ: Mapping[str, str] | None = None) -> str:
    """This rank's node as the scheduler names it (SLURMD_NODENAME: what `--exclude` takes; a host name may be
    a longer form of it), else the host name."""
    environ = os.environ if environ is None else environ
    return environ.get("SLURMD_NODENAME", "").strip() or socket.gethostname()


def run_token(environ: Mapping[str, str] | None = None) -> str:
    """A name the ranks of one launch share without talking (torchrun's run id, else the SLURM job step, else
    the rendezvous address): the watcher ignores files an earlier run left in the same run directory."""
    environ = os.environ if environ is None else environ
    parts = [
        environ.get(name, "")
        for name in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID", "MASTER_ADDR", "MASTER_PORT")
    ]
    return "/".join(parts)
