"""Render a job spec + site profile into a deterministic, commented sbatch script. Never imports torch.

Shell-executed values go through ``shlex.quote``; ``#SBATCH`` lines are parsed by sbatch itself (not by
bash), so values there are double-quoted with backslash escapes when they contain spaces or quotes, and
control characters are rejected by JobSpec. Nothing here reads the environment of the calling process.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from exatrain.env.nics import GLOO_IFNAME
from exatrain.errors import EXIT_HANG
from exatrain.slurm.binding import cpu_binding
from exatrain.slurm.container_env import entry_words
from exatrain.slurm.presets import job_env, network_flag, preset_for
from exatrain.slurm.profiles import SiteProfile
from exatrain.slurm.rank_command import (
    check_interpreter_options,
    command_kind,
    mask_option,
    run_under_script_runner,
    starts_script_runner,
    wrap_in_exatrain_run,
)
from exatrain.slurm.rendezvous import rendezvous_words
from exatrain.slurm.requeue import EXIT_REQUEUE, HANG_EXCLUDE, HANG_REQUEUES, REQUEUE_MARKER
from exatrain.slurm.spec import JobSpec
from exatrain.slurm.sweep import Sweep
from exatrain.slurm.torchrun_line import agent_start, agent_start_note

# The one table of spec fields that map 1:1 to sbatch flags (empty values are left out).
SPEC_FLAGS = {
    "account": "--account",
    "error": "--error",
    "name": "--job-name",
    "nodes": "--nodes",
    "output": "--output",
    "partition": "--partition",
    "qos": "--qos",
    "reservation": "--reservation",
    "signal": "--signal",
}
CACHE_ROOT = 'exatrain-"${USER:-$(id -un)}"-"$SLURM_JOB_ID"'
SMOKE_TOOLS = {"nvidia": ("nvidia-smi -L",), "amd": ("amd-smi list", "rocm-smi --showuniqueid"), "none": ()}
# Python one-liner run on the batch node: first host of the node list (exatrain's own expansion, no
# scontrol needed, works in containers) and the rendezvous port derived from the job id.
RDZV_PY = (
    "import sys; from exatrain.env.hostlist import expand_nodelist; from exatrain.env.ports "
    "import derive_port; "
    'print(expand_nodelist(sys.argv[1], "SLURM_JOB_NODELIST")[0], derive_port(sys.argv[2]))'
)


def render_sbatch(
    spec: JobSpec,
    profile: SiteProfile,
    run_dir: str,
    config: tuple[str, str] | None = None,
    sweep: Sweep | None = None,
    binds: tuple[str, ...] = (),
) -> str:
    """The whole script: header, environment, per-node preparation and the launch line.

    ``config`` = (file, TOML text): the script writes the text to the file and exatrain's trainer reads it
    with ``--config``, so the script is all a job needs. With a ``sweep`` the script is a job array whose
    task i trains in ``RUN_DIR/array-i`` with the i-th value of every swept key. ``binds``: further paths
    the ranks read or write (launch.containers), bound into a container besides the run directory.
    """
    spec.check_against(profile)
    rank_args = _Trainer(run_dir, config[0] if config else "", sweep, binds)
    parts = [
        _shebang(spec, profile),
        "\n".join(f"#SBATCH {flag}" for flag in sbatch_flags(spec, profile, sweep)),
        "set -euo pipefail",
        _run_dir(run_dir, sweep),
        _config_file(config),
        _environment(spec, profile),
        _prepare_nodes(spec, profile),
        _launch(spec, profile, rank_args),
    ]
    return "\n\n".join(p for p in parts if p) + "\n"


def sbatch_flags(spec: JobSpec, profile: SiteProfile, sweep: Sweep | None = None) -> list[str]:
    """All ``--flag=value`` strings of the header, sorted by flag name (deterministic, easy to diff)."""
    values = {flag: str(getattr(spec, key)) for key, flag in SPEC_FLAGS.items()}
    values["--array"] = f"0-{sweep.size - 1}" if sweep else ""
    values["--partition"] = spec.partition or profile.partition
    values["--time"] = spec.slurm_time()
    values["--open-mode"] = "append"  # requeued runs append to, not truncate, their output
    ranks, cpus = spec.ranks_per_node(profile), spec.cpus(profile)
    torchrun = spec.launch == "torchrun"
    values["--ntasks-per-node"] = "1" if torchrun else str(ranks)
    values["--cpus-per-task"] = str(cpus * ranks if torchrun else cpus)
    if profile.gpus_per_node:
        # A script wrapped in `exatrain run` picks cuda:LOCAL_RANK,
        # as under torchrun: it must see the node's GPUs.
        per_task = profile.visibility == "gpus-per-task" and command_kind(list(spec.command)) not in (
            "python",
            "wrapped",
        )
        key = "--gpus-per-task" if per_task and not torchrun else "--gpus-per-node"
        values[key] = "1" if key == "--gpus-per-task" else str(ranks)
        if spec.mem_gb(profile):
            values["--mem-per-gpu"] = f"{spec.mem_gb(profile)}G"
    flags = [f"{flag}={_sbatch_quote(value)}" for flag, value in values.items() if value]
    flags += _requeue_flags() + _network_flags(spec, profile)
    return sorted(flags + list(spec.extra_sbatch), key=lambda f: (f.split("=")[0], f))


def _requeue_flags() -> list[str]:
    """``--requeue``: the script requeues its job after a pre-timeout checkpoint (``scontrol requeue`` in the
    tail below, or rank 0's), which SLURM refuses for a job that is not requeueable ("Requested operation is
    presently disabled"), as every job is by default where a site sets JobRequeue=0 in slurm.conf."""
    return ["--requeue"]


def _network_flags(spec: JobSpec, profile: SiteProfile) -> list[str]:
    """``--network=disable_rdzv_get`` exactly where the job's environment selects libfabric's alt_read
    rendezvous protocol (exatrain.slurm.presets.network_flag: both or neither)."""
    flag = network_flag(dict(_comm_env(spec, profile) + list(spec.env)), spec.extra_sbatch)
    return [flag] if flag else []


def _comm_env(spec: JobSpec, profile: SiteProfile) -> list[tuple[str, str]]:
    """The profile's presets for this job: [comm_env], its container generation's [[presets]] env, on more
    than one node [multi_node_env], and in a container job [container_env]."""
    return job_env(
        profile.comm_env,
        profile.presets,
        profile.multi_node_env,
        spec.container_image,
        spec.nodes,
        profile.container_env,
    )


def _sbatch_quote(value: str) -> str:
    """Quote for sbatch's own #SBATCH parser (double quotes, backslash escapes; not a shell)."""
    if value and not any(c in value for c in " \t\"'\\#"):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _shebang(spec: JobSpec, profile: SiteProfile) -> str:
    return "\n".join(
        [
            "#!/bin/bash",
            f"# Generated by exatrain: profile {profile.name}, launch mode {spec.launch}.",
            "# Edit the job spec and render again rather than editing this file.",
        ]
        + _signal_note(spec)
    )


def _signal_note(spec: JobSpec) -> list[str]:
    if not spec.signal:
        return []
    if spec.signal.startswith("B:"):
        return [
            f"# --signal={spec.signal}: B: sends it to this batch shell only (trap it here to forward it)."
        ]
    return [
        f"# --signal={spec.signal}: sent to every rank (not the batch shell) before the time "
        "limit, to checkpoint."
    ]


def _run_dir(run_dir: str, sweep: Sweep | None) -> str:
    lines = [
        "# Run directory (quoted: the path is data, never shell code).",
        f"RUN_DIR={shlex.quote(run_dir)}",
    ]
    if sweep:
        lines.append(
            "# Job array: task i trains in its own run directory with the i-th value of each swept key."
        )
        lines.append('RUN_DIR="$RUN_DIR"/array-"$SLURM_ARRAY_TASK_ID"')
        lines += [
            f"SWEEP_{i}=({' '.join(map(shlex.quote, values))})  # {key}"
            for i, (key, values) in enumerate(zip(sweep.keys, sweep.values))
        ]
    return "\n".join(
        lines
        + [
            'mkdir -p -- "$RUN_DIR"',
            'echo "exatrain job $SLURM_JOB_ID ($SLURM_JOB_NAME) on $SLURM_JOB_NODELIST, run dir $RUN_DIR"',
        ]
    )


_CONFIG_END = "EXATRAIN_CONFIG_END"  # TOML lines are "key = value" or "[section]": never this bare word


def _config_file(config: tuple[str, str] | None) -> str:
    if not config:
        return ""
    path, text = config
    return "\n".join(
        [
            "# The configuration the ranks train with (--config below), written by this script "
            "so that the script",
            "# is all the job needs. A quoted here-document: nothing in it is expanded by the shell.",
            f"cat > {shlex.quote(path)} <<'{_CONFIG_END}'",
            text.rstrip("\n"),
            _CONFIG_END,
        ]
    )


def exported_names(spec: JobSpec, profile: SiteProfile) -> list[str]:
    """Every variable the script exports for the ranks (the container gets each of them too)."""
    names = [k for k, _ in _comm_env(spec, profile)] + [k for k, _ in profile.caches] + ["OMP_NUM_THREADS"]
    names += [k for k, _ in spec.env]
    return sorted(set(names))


def _environment(spec: JobSpec, profile: SiteProfile) -> str:
    lines = _comm_env_lines(spec, profile)
    if profile.caches:
        lines.append(
            "# Per-node caches on node-local disk: the same path on every node, one directory per node"
        )
        lines.append("# and job, so ranks never share SQLite/lock files over the parallel file system.")
        lines.append(f"NODE_CACHE={shlex.quote(profile.node_local_tmp)}/{CACHE_ROOT}")
        lines += [f'export {k}="$NODE_CACHE"/{shlex.quote(sub)}' for k, sub in profile.caches]
    lines.append("# One OpenMP thread per core of a rank.")
    if spec.launch == "torchrun":
        ranks = spec.ranks_per_node(profile)
        lines.append(
            f"export OMP_NUM_THREADS=$(( ${{SLURM_CPUS_PER_TASK:-{ranks}}} / {ranks} ))  # one "
            "task holds all ranks' cores"
        )
    else:
        lines.append('export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"')
    if spec.env:
        lines.append("# The job spec's own environment (wins over the presets above).")
        lines += [f"export {k}={shlex.quote(v)}" for k, v in spec.env]
    if spec.container_image:
        prefix = profile.container_runtime.upper() + "ENV_"
        lines.append(f"# {profile.container_runtime} passes {prefix}NAME into the container as NAME.")
        lines += [f'export {prefix}{k}="${k}"' for k in exported_names(spec, profile)]
    return "\n".join(lines)


def _comm_env_lines(spec: JobSpec, profile: SiteProfile) -> list[str]:
    """The exports of _comm_env, with a comment naming the container generation whose presets apply."""
    env = _comm_env(spec, profile)
    if not env:
        return []
    lines = [f"# Communication presets of profile {profile.name} (see the profile file for their sources)."]
    preset = preset_for(spec.container_image, profile.presets)
    if preset:
        lines.append(f"# Container generation: {preset.name}.")
        lines += [f"# Source: {preset.source}"] if preset.source else []
    lines += _only_in(profile.multi_node_env, "jobs of more than one node", spec.nodes > 1)
    lines += _only_in(
        profile.container_env,
        "jobs with a container, as the site's container bindings module sets it",
        bool(spec.container_image),
    )
    return lines + [f"export {k}={shlex.quote(v)}" for k, v in env]


def _only_in(env: tuple[tuple[str, str], ...], jobs: str, this_one: bool) -> list[str]:
    """The comment naming presets that only some jobs export, and whether this job does."""
    if not env:
        return []
    names = ", ".join(k for k, _ in env)
    return [f"# {names}: only in {jobs}" + (" (this one)." if this_one else ": not exported here.")]


def _container(spec: JobSpec, profile: SiteProfile, rank: _Trainer) -> list[str]:
    """The container prefix: the site's paths (profile container_binds), the run directory, the node-local
    caches, the paths the ranks read or write, and the user's binds."""
    if not spec.container_image:
        return []
    binds = container_binds(spec, profile, rank.binds, rank.run_dir)
    return [
        profile.container_runtime,
        spec.container_start,
        f"--bind={','.join(binds)}",
        spec.container_image,
        *entry_words(
            profile.container_runtime,
            spec.container_image,
            spec.container_venv,
            tuple(b for b in binds if b not in profile.container_binds),
        ),
    ]


def container_binds(
    spec: JobSpec, profile: SiteProfile, rank_binds: tuple[str, ...], run_dir: str
) -> list[str]:
    """Every --bind of a container job: the site's (profile), the user's, the ranks' paths, the run directory
    and the node-local caches."""
    return sorted(
        set(spec.container_binds)
        | set(profile.container_binds)
        | set(rank_binds)
        | {run_dir, profile.node_local_tmp}
    )


def _prepare_nodes(spec: JobSpec, profile: SiteProfile) -> str:
    """One task per node (local rank 0 of each node): create the caches, then a GPU smoke test."""
    body = []
    if profile.caches:
        dirs = " ".join(f'"${k}"' for k in sorted({k for k, _ in profile.caches}))
        body.append(f"mkdir -p {dirs}")
    tools = SMOKE_TOOLS[profile.gpu_vendor]
    if tools:
        checks = "".join(
            f"{'el' if i else ''}if command -v {t.split()[0]} >/dev/null 2>&1; then {t}; "
            for i, t in enumerate(tools)
        )
        body.append('echo "GPU smoke test on $(hostname):"')
        body.append(
            checks + 'else echo "no ' + "/".join(t.split()[0] for t in tools) + ' found; skipping"; fi'
        )
    if not body:
        return ""
    return "\n".join(
        [
            "# Per-node preparation, one task per node before the ranks start (race-free: one "
            "mkdir per node).",
            "# A failing GPU tool fails the job here, before an expensive launch.",
            'srun --nodes="$SLURM_NNODES" --ntasks="$SLURM_NNODES" --ntasks-per-node=1 \\',
            f"    bash -c {shlex.quote('; '.join(['set -euo pipefail'] + body))}",
        ]
    )


@dataclass(frozen=True)
class _Trainer:
    """What exatrain's own trainer is told on its command line."""

    run_dir: str
    config_file: str
    sweep: Sweep | None
    binds: tuple[str, ...] = ()


def _command(spec: JobSpec, profile: SiteProfile, rank: _Trainer) -> str:
    """The rank command as shell text; exatrain's own trainer also learns its config, run directory and
    the master suffix (array tasks: their run directory and swept values, expanded by the batch shell).
    In srun mode a Python script or module is wrapped in `exatrain run`, which gives it torchrun's
    variables."""
    cmd = list(spec.command)
    kind = command_kind(cmd)
    if kind == "python":
        if spec.launch == "srun":
            return shlex.join(wrap_in_exatrain_run(cmd, spec.profile, spec.label))
        masks = cpu_binding(
            spec, profile
        ).masks  # the runner binds each worker to its mask (launch.script_runner)
        per_gpu = bool(profile.gpus_per_node)
        return shlex.join(run_under_script_runner(cmd, masks, per_gpu=per_gpu, label=spec.label))
    if kind == "other" and spec.launch == "srun":
        check_interpreter_options(cmd)
    if kind != "trainer":
        return shlex.join(cmd)
    if rank.config_file:
        cmd.append(f"--config={rank.config_file}")
    if not rank.sweep:
        cmd.append(f"--run.dir={rank.run_dir}")
    if profile.master_suffix and spec.launch == "srun":
        cmd.append(f"--dist.master_suffix={profile.master_suffix}")
    if not rank.sweep:
        return shlex.join(cmd)
    swept = [f'--{key}="${{SWEEP_{i}[$SLURM_ARRAY_TASK_ID]}}"' for i, key in enumerate(rank.sweep.keys)]
    return " ".join([shlex.join(cmd), '--run.dir="$RUN_DIR"', *swept])


def _launch(spec: JobSpec, profile: SiteProfile, rank: _Trainer) -> str:
    body = (_launch_torchrun if spec.launch == "torchrun" else _launch_srun)(spec, profile, rank)
    markers = [REQUEUE_MARKER, *([HANG_EXCLUDE] if spec.hang_requeues else [])]
    stale_files = " ".join(f'"$RUN_DIR"/{m}' for m in markers)
    stale = f"rm -f -- {stale_files}  # left by an earlier run: only this one's counts"
    hang = _HANG_TAIL.replace("@N@", str(spec.hang_requeues)) if spec.hang_requeues else ""
    return stale + "\nrc=0\n" + body + " || rc=$?\n\n" + hang + _REQUEUE_TAIL.rstrip("\n")


_HANG_TAIL = f"""# Exit code {EXIT_HANG} (or, under torchrun, the file RUN_DIR/{HANG_EXCLUDE} the diagnosis \
writes): a rank hung
# and every rank stopped (RUN_DIR/hang/diagnosis.txt). job.hang_requeues = @N@: requeue the job, at most @N@
# time(s) for hangs, without the node(s) the diagnosis names in that file. SLURM changes a job's excluded
# nodes only while it is pending: requeue it held, update it, release it; TERM is ignored meanwhile (the
# requeue's kill would end this shell between the steps).
if [ "$rc" -eq {EXIT_HANG} ] || [ -e "$RUN_DIR"/{HANG_EXCLUDE} ]; then
    hung=$(( $(grep -cx "$SLURM_JOB_ID" "$RUN_DIR"/{HANG_REQUEUES} 2>/dev/null || true) + 1 ))  # this job's
    bad=$(cat "$RUN_DIR"/{HANG_EXCLUDE} 2>/dev/null || true)
    rm -f -- "$RUN_DIR"/{HANG_EXCLUDE}
    if [ "$hung" -gt @N@ ]; then
        echo "exatrain: job $SLURM_JOB_ID stopped on a hang again; job.hang_requeues = @N@ used up." >&2
    else
        mkdir -p "$RUN_DIR"/hang && echo "$SLURM_JOB_ID" >> "$RUN_DIR"/{HANG_REQUEUES}
        trap '' TERM
        if scontrol requeuehold "$SLURM_JOB_ID"; then
            if [ -n "$bad" ]; then
                old=$(scontrol show job "$SLURM_JOB_ID" | grep -o 'ExcNodeList=[^ ]*' | cut -d= -f2 || true)
                [ "$old" != "(null)" ] || old=""
                scontrol update JobId="$SLURM_JOB_ID" ExcNodeList="${{old:+$old,}}$bad" ||
                    echo "exatrain: could not exclude $bad from job $SLURM_JOB_ID" >&2
            fi
            scontrol release "$SLURM_JOB_ID"
            echo "exatrain: job $SLURM_JOB_ID requeued after a hang (${{bad:-no node}} excluded)" >&2
        else
            echo "exatrain: SLURM refused to requeue job $SLURM_JOB_ID after the hang; its checkpoints are \
kept." >&2
        fi
    fi
fi

"""


_REQUEUE_TAIL = f"""# Exit code {EXIT_REQUEUE} (or, under torchrun, whose agent exits 1 after forwarding a \
signal, the file
# RUN_DIR/{REQUEUE_MARKER}): exatrain checkpointed on a pre-timeout signal but could not requeue the job
# itself (no scontrol where the ranks run, e.g. in a container): the batch shell has the SLURM tools.
# SLURM refuses the requeue of a job submitted with --no-requeue (or SBATCH_NO_REQUEUE set, which wins
# over the --requeue above): the checkpoint stays, and the message says how to go on.
if [ "$rc" -eq {EXIT_REQUEUE} ] || [ -e "$RUN_DIR"/{REQUEUE_MARKER} ]; then
    rm -f -- "$RUN_DIR"/{REQUEUE_MARKER}
    scontrol requeue "$SLURM_JOB_ID" || {{
        echo "exatrain: SLURM refused to requeue job $SLURM_JOB_ID; its checkpoint in $RUN_DIR is kept." >&2
        echo "HINT: submit it again (checkpoint.resume = 'auto' resumes it), without --no-requeue" >&2
        echo "and with SBATCH_NO_REQUEUE unset, so that it requeues itself next time." >&2
    }}
fi
exit "$rc"
"""


_SRUN_NOTE = {
    "trainer": "exatrain derives rank, world size, master address (first host of the\n# step's node list) "
    "and port (from job and step id) from SLURM's variables itself: no exports needed.",
    "python": "`exatrain run` gives the script torchrun's variables (RANK, LOCAL_RANK,\n# WORLD_SIZE, "
    "LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT) from SLURM's, then becomes the script.",
    "other": "job.command is neither exatrain's trainer nor a Python script: it runs as\n# given, with only "
    "SLURM's variables (wrap a Python script in `exatrain run` to get RANK, MASTER_ADDR, ...).",
}
_SRUN_NOTE["wrapped"] = _SRUN_NOTE["python"]


def _launch_srun(spec: JobSpec, profile: SiteProfile, rank: _Trainer) -> str:
    srun = [
        "srun",
        f"--ntasks-per-node={spec.ranks_per_node(profile)}",
        '--cpus-per-task="$SLURM_CPUS_PER_TASK"',
    ]
    lines = [
        "# Launch: one task per GPU. " + _SRUN_NOTE[command_kind(list(spec.command))],
        "# --cpus-per-task is repeated because srun does not inherit it from sbatch (Slurm >= 22.05).",
    ]
    binding = cpu_binding(spec, profile)
    if binding.reason:
        lines.append(f"# --cpu-bind: {binding.reason}.")
    if binding.masks:
        srun.append(f"--cpu-bind=mask_cpu:{','.join(binding.masks)}")
    words = [" ".join(srun), shlex.join(_container(spec, profile, rank)), _command(spec, profile, rank)]
    return "\n".join(lines) + "\n" + " \\\n    ".join(w for w in words if w)


def _torchrun_binding_note(spec: JobSpec, profile: SiteProfile) -> list[str]:
    """One task per node holds all the node's cores: srun cannot bind per GPU; exatrain's trainer and the
    script runner (a Python script) bind each worker themselves."""
    binding = cpu_binding(spec, profile)
    if not binding.masks:
        return [f"# CPU binding: {binding.reason}."] if binding.reason else []
    whose = "its GPU" if profile.gpus_per_node else "its local rank"
    head = "# CPU binding: srun cannot bind per GPU here (one task per node); "
    cmd = list(spec.command)
    if command_kind(cmd) == "trainer":
        return [
            head + "exatrain's trainer binds each",
            f"# worker to the profile's mask of {whose} before it allocates, where the task holds "
            "those cores.",
        ]
    if starts_script_runner(cmd):
        return [
            head + "the script runner binds each",
            f"# worker to the profile's mask of {whose} "
            f"({mask_option(bool(profile.gpus_per_node))}) before the script starts, where the "
            "task",
            "# holds those cores (a worker it cannot bind says why).",
        ]
    return [
        head + "this command is neither exatrain's",
        "# trainer nor a Python script the script runner starts, so its workers stay unbound.",
    ]


def _torchrun_script_note(spec: JobSpec) -> list[str]:
    cmd = list(spec.command)
    if not starts_script_runner(cmd):
        return []
    return [
        "# exatrain.launch.script_runner runs the script as python would, then exits without Python's",
        "# finalization (where a gloo thread still holding tensors aborts the worker in torch 2.13).",
    ]


def _narrows_gloo(spec: JobSpec, profile: SiteProfile) -> bool:
    return GLOO_IFNAME in exported_names(spec, profile)


def _node_agent(spec: JobSpec, profile: SiteProfile, per_node: list[str]) -> str:
    """The shell of each node's task: keep the GLOO_SOCKET_IFNAME interfaces this node has (`env.nics`;
    none of them fails the task at once, naming them), then become exatrain's agent (torchrun's agent with
    the node's torch, launch/agent.py) with the per-node options."""
    is_host = '--rdzv-conf=is_host="$([ "$SLURM_NODEID" = 0 ] && echo true || echo false)"'
    agent = " ".join([agent_start(spec.signal, spec.signal_lead()), is_host, *per_node, '"$@"'])
    if not _narrows_gloo(spec, profile):
        return agent
    return f'G=$(python3 -m exatrain.env.nics) || exit 1; export {GLOO_IFNAME}="$G"; {agent}'


def _node_agent_note(spec: JobSpec, profile: SiteProfile) -> list[str]:
    lines = []
    if profile.master_suffix:
        lines += [
            f"# Each agent advertises its node's name plus {profile.master_suffix!r} (--local-addr): "
            "node 0's is the address its workers",
            "# get as MASTER_ADDR (torchrun's default, the plain host name, is another network here).",
        ]
    if _narrows_gloo(spec, profile):
        lines += [
            f"# {GLOO_IFNAME} keeps the interfaces each node has (gloo fails on a missing one); a node "
            "with none of them",
            "# fails here, naming them (python3 -m exatrain.env.nics).",
        ]
    return lines


def _launch_torchrun(spec: JobSpec, profile: SiteProfile, rank: _Trainer) -> str:
    ranks = spec.ranks_per_node(profile)
    container = shlex.join(_container(spec, profile, rank))
    py = (container + " " if container else "") + f"python3 -c {shlex.quote(RDZV_PY)}"
    shared, per_node = rendezvous_words(profile.master_suffix)
    torchrun = [shared[0], f"--nproc-per-node={ranks}", *shared[1:], "--no-python"]
    lines = (
        [
            "# Rendezvous: the first host of the node list, expanded by exatrain (no scontrol: "
            "works in containers),",
            "# and a port derived from the job id so that jobs sharing a node do not collide.",
            f'RDZV=$({py} "$SLURM_JOB_NODELIST" "$SLURM_JOB_ID")',
            "RDZV_HEAD=${RDZV% *}",
            "RDZV_PORT=${RDZV#* }",
            'echo "rendezvous at $RDZV_HEAD:$RDZV_PORT"',
            "# Launch: one task per node runs torchrun, which starts one worker per GPU. The "
            "first node hosts the",
            "# c10d store (is_host), which matters where the endpoint name differs from the host "
            "name (suffix).",
        ]
        + agent_start_note(spec.signal)
        + _torchrun_binding_note(spec, profile)
        + _torchrun_script_note(spec)
        + _node_agent_note(spec, profile)
    )
    words = [
        'srun --ntasks-per-node=1 --cpus-per-task="$SLURM_CPUS_PER_TASK"',
        container,
        f"bash -c {shlex.quote(_node_agent(spec, profile, per_node))} agent",
        " ".join(torchrun),
        _command(spec, profile, rank),
    ]
    return "\n".join(lines) + "\n" + " \\\n    ".join(w for w in words if w)
