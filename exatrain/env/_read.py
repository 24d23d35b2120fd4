"""Reading single values out of an environment mapping, with errors that name the variable."""

from __future__ import annotations

from collections.abc import Mapping

from exatrain.errors import ClusterEnvError

SLURM_JOB_ID_VARS = ("SLURM_JOB_ID", "SLURM_JOBID")
SLURM_STEP_ID_VARS = ("SLURM_STEP_ID", "SLURM_STEPID")


def first_set(environ: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """Return ``(name, value)`` of the first of ``names`` set to a non-empty value, else None.

    Empty values count as unset: ``export MASTER_ADDR=`` means "no choice", not "the empty host".
    """
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            return name, value
    return None


def require(environ: Mapping[str, str], *names: str, why: str) -> tuple[str, str]:
    """Like :func:`first_set`, but a missing value is a :class:`ClusterEnvError` saying ``why`` it is
    needed."""
    found = first_set(environ, *names)
    if found is None:
        wanted = " or ".join(names)
        raise ClusterEnvError(
            f"{wanted} is not set, but {why}",
            f"set {names[0]} or launch through the tool that normally sets it (srun, torchrun, mpirun)",
        )
    return found


def parse_int(value: str, source: str, minimum: int = 0) -> int:
    """Parse ``value`` (read from variable ``source``) as an integer >= ``minimum``."""
    try:
        number = int(value.strip())
    except ValueError:
        number = None
    if number is None or number < minimum:
        raise ClusterEnvError(
            f"{source}={value!r} is not an integer >= {minimum}",
            f"check how {source} is set (printenv {source}); launchers set it to a plain number",
        )
    return number


def require_int(environ: Mapping[str, str], name: str, *, why: str, minimum: int = 0) -> int:
    """Read the required variable ``name`` as an integer >= ``minimum``."""
    return parse_int(require(environ, name, why=why)[1], name, minimum)


def check_below(value: int, value_source: str, bound: int, bound_source: str) -> None:
    """Raise unless ``value < bound``: a rank must be smaller than the size it indexes into."""
    if value >= bound:
        _contradiction(f"{value_source}={value} is not below {bound} ({bound_source})")


def check_at_most(value: int, value_source: str, bound: int, bound_source: str) -> None:
    """Raise unless ``value <= bound``: a part (e.g. processes on one node) cannot exceed the whole."""
    if value > bound:
        _contradiction(f"{value_source}={value} exceeds {bound} ({bound_source})")


def _contradiction(what: str) -> None:
    raise ClusterEnvError(
        f"{what}: the launcher's variables contradict each other",
        "they are mixed up (e.g. exported by hand or inherited from another job or step); "
        "start every process with srun, torchrun or mpirun instead of setting rank variables yourself",
    )


def slurm_job_id(environ: Mapping[str, str]) -> str | None:
    """The SLURM job id if this process runs inside a SLURM allocation (batch shell, salloc or step)."""
    found = first_set(environ, *SLURM_JOB_ID_VARS)
    return found[1] if found else None


def slurm_step_id(environ: Mapping[str, str]) -> str | None:
    """The SLURM step id if this process was started by ``srun`` as a job step, else None."""
    found = first_set(environ, *SLURM_STEP_ID_VARS)
    return found[1] if found else None


def read_restart_count(environ: Mapping[str, str]) -> int:
    """Restarts so far: TORCHELASTIC_RESTART_COUNT (torchrun's agent) or SLURM_RESTART_COUNT (requeue)."""
    counts = [
        parse_int(environ[name], name)
        for name in ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")
        if environ.get(name, "").strip()
    ]
    return max(counts, default=0)
