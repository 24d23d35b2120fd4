"""Site correctness (issue 11): communication presets, job-spec coherence and copy-paste safety.

Expected values come from the sources named in each test (the seed slides, sbatch's manual), not from the
profile files under test.
"""

import shlex
import subprocess
import sys

import pytest

from exatrain.errors import ConfigError
from exatrain.slurm import JobSpec, bundled_profiles, load_profile, render_sbatch
from exatrain.slurm.profiles import PROFILE_DIR


def _exports(text):
    return dict(
        line[len("export ") :].split("=", 1)
        for line in text.splitlines()
        if line.startswith("export ") and "=" in line
    )


# --- point 5: communication presets -------------------------------------------------------------------


def test_lumi_exports_every_mandatory_libfabric_setting():
    """Seed 003 ("Essential Libfabric Environment Settings", mandatory for RCCL on Slingshot)."""
    exports = _exports(render_sbatch(JobSpec(), load_profile("lumi-g"), "runs/x"))
    mandatory = {
        "HSA_FORCE_FINE_GRAIN_PCIE": "1",
        "FI_MR_CACHE_MONITOR": "userfaultfd",
        "FI_CXI_DISABLE_HOST_REGISTER": "1",
        "FI_CXI_DEFAULT_CQ_SIZE": "131072",
        "FI_CXI_RDZV_PROTO": "alt_read",
        "FI_CXI_RX_MATCH_MODE": "hybrid",
    }
    for name, value in mandatory.items():
        assert exports.get(name) == value, name


@pytest.mark.parametrize("profile", bundled_profiles())
@pytest.mark.parametrize("mode", ["srun", "torchrun"])
def test_gloo_uses_the_interfaces_nccl_uses(profile, mode):
    """gloo groups (CPU collectives, async saves) must not pick another interface than NCCL/RCCL: a site
    profile pins both to its fabric's interfaces (LUMI-G: hsn0..3, seed 002), a generic one knows no
    interface names and pins neither."""
    exports = _exports(render_sbatch(JobSpec(launch=mode), load_profile(profile), "runs/x"))
    gloo, nccl = exports.get("GLOO_SOCKET_IFNAME"), exports.get("NCCL_SOCKET_IFNAME")
    assert gloo == nccl
    if profile == "cpu" or profile.startswith("generic-"):
        assert nccl is None
    else:
        assert nccl and "lo" not in nccl.split(",")
    if profile == "lumi-g":
        assert nccl == "hsn0,hsn1,hsn2,hsn3"


def _user_profile(tmp_path, comm_env):
    """A copy of generic-nvidia with extra [comm_env] lines, as a user would write it."""
    base = (PROFILE_DIR / "generic-nvidia.toml").read_text()
    path = tmp_path / "site.toml"
    path.write_text(base.replace("[comm_env]\n", "[comm_env]\n" + comm_env + "\n"))
    return str(path)


def test_user_profile_with_nccl_interfaces_gets_gloo_ones(tmp_path):
    profile = load_profile(_user_profile(tmp_path, 'NCCL_SOCKET_IFNAME = "ib0,ib1"'))
    assert dict(profile.comm_env)["GLOO_SOCKET_IFNAME"] == "ib0,ib1"


def test_user_profile_with_nccl_exclusion_syntax_needs_explicit_gloo(tmp_path):
    with pytest.raises(ConfigError, match="no GLOO_SOCKET_IFNAME") as exc:
        load_profile(_user_profile(tmp_path, 'NCCL_SOCKET_IFNAME = "^docker,lo"'))
    assert "GLOO_SOCKET_IFNAME" in exc.value.hint


@pytest.mark.parametrize("mode", ["srun", "torchrun"])
def test_amd_profiles_give_every_rank_the_whole_node(mode):
    """Seed: --gpus-per-task=1 hides the other GCDs from a rank and breaks RCCL's peer-to-peer transport."""
    for name in bundled_profiles():
        profile = load_profile(name)
        if profile.gpu_vendor != "amd":
            continue
        text = render_sbatch(JobSpec(launch=mode), profile, "runs/x")
        assert "--gpus-per-task" not in text, name
        assert f"#SBATCH --gpus-per-node={profile.gpus_per_node}" in text, name


# --- point 7: job-spec coherence ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("time", "seconds"),
    [
        # sbatch(1), --time: "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
        # "days-hours:minutes" and "days-hours:minutes:seconds"
        ("90", 90 * 60),
        ("90:30", 90 * 60 + 30),
        ("02:00:00", 7200),
        ("1-12", 36 * 3600),
        ("1-12:30", 36 * 3600 + 1800),
        ("2-03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5),
        ("48:00:00", 48 * 3600),
    ],
)
def test_every_slurm_time_form(time, seconds):
    spec = JobSpec(time=time)
    assert spec.seconds() == seconds
    # the script's --time means the same limit in one unambiguous form
    assert JobSpec(time=spec.slurm_time()).seconds() == seconds


@pytest.mark.parametrize(
    "time",
    [
        "1:2:3:4",
        "1-2-3",
        "01:60:00",
        "1-24:00",
        "2h",
        "1.5",
        "-5",
        " 30",
        "1-",
        ":30",
        "0",
        "00:00:30",
        "400-00:00:00",
    ],
)
def test_everything_else_is_no_time(time):
    with pytest.raises(ConfigError, match="job.time") as exc:
        JobSpec(time=time)
    assert exc.value.hint


@pytest.mark.parametrize(
    ("time", "signal"), [("2", "USR2@120"), ("10", "USR2@600"), ("00:30:00", "USR2@3600")]
)
def test_signal_lead_at_or_beyond_the_limit_is_refused(time, signal):
    with pytest.raises(ConfigError, match="lead time|before the end") as exc:
        JobSpec(time=time, signal=signal)
    assert "lead time" in exc.value.hint


def test_signal_lead_inside_the_limit_is_fine():
    assert JobSpec(time="3", signal="USR2@120").signal_lead() == 120


def test_batch_shell_signal_is_refused():
    """exatrain's script traps nothing in the batch shell, so a B: signal would never reach the ranks."""
    with pytest.raises(ConfigError, match="batch shell only") as exc:
        JobSpec(signal="B:USR2@120")
    assert "'USR2@120'" in exc.value.hint


def test_signal_the_trainer_does_not_handle_is_refused():
    from exatrain.slurm.spec import check_signal_handled

    with pytest.raises(ConfigError, match="not among checkpoint.signals") as exc:
        check_signal_handled(JobSpec(signal="USR1@120"), "USR2,TERM")
    assert "USR1" in exc.value.hint
    check_signal_handled(JobSpec(signal="USR1@120"), "SIGUSR1")
    check_signal_handled(JobSpec(signal=""), "")


def test_submit_refuses_a_signal_the_trainer_does_not_handle(tmp_path):
    from exatrain.config import load_config
    from exatrain.slurm.submit import prepare

    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[run]\ndir = "{tmp_path}/run"\n[job]\nsignal = "USR1@120"\n[checkpoint]\nsignals = "USR2"\n'
    )
    with pytest.raises(ConfigError, match="not among checkpoint.signals"):
        prepare(load_config(str(cfg), []))
    # a command of the user's own is not exatrain's trainer: its signals are its own business
    cfg.write_text(
        f'[run]\ndir = "{tmp_path}/run"\n[job]\nsignal = "USR1@120"\ncommand = ["python", "t.py"]\n'
        '[checkpoint]\nsignals = "USR2"\n'
    )
    assert "--signal=USR1@120" in prepare(load_config(str(cfg), [])).script


@pytest.mark.parametrize(
    "flag",
    [
        "--partition=small-g",
        "--time=10",
        "--nodes=4",
        "--mem-per-gpu=10G",
        "--gpus-per-node=2",
        "--cpus-per-task=3",
        "--signal=USR1@60",
        "--job-name=x",
    ],
)
def test_extra_sbatch_duplicating_a_generated_flag_is_refused(flag):
    with pytest.raises(ConfigError, match="duplicates") as exc:
        JobSpec(extra_sbatch=(flag,))
    assert "job." in exc.value.hint or "--array" in exc.value.hint


@pytest.mark.parametrize(
    "flag", ["--mem=100G", "--mem-per-cpu=2G", "--gres=gpu:4", "--gpus=8", "--ntasks=16"]
)
def test_extra_sbatch_contradicting_a_generated_flag_is_refused(flag):
    with pytest.raises(ConfigError, match="contradicts"):
        JobSpec(extra_sbatch=(flag,))


def test_extra_sbatch_of_other_flags_is_kept():
    text = render_sbatch(
        JobSpec(extra_sbatch=("--exclusive", "--constraint=a100")), load_profile("generic-nvidia"), "runs/x"
    )
    assert "#SBATCH --exclusive" in text and "#SBATCH --constraint=a100" in text


@pytest.mark.parametrize(
    ("key", "value"),
    [("nodes", 1_000_000), ("gpus_per_node", 512), ("cpus_per_task", 100_000), ("mem_per_gpu_gb", 1_000_000)],
)
def test_absurd_sizes_are_refused(key, value):
    with pytest.raises(ConfigError, match=f"job.{key} = {value} is beyond"):
        JobSpec(**{key: value})


# --- point 9: copy-paste safety --------------------------------------------------------------------------


def test_dry_run_prints_shell_quoted_commands(tmp_path):
    """The dry run's sbatch line, pasted into a shell, names the script even in a directory with spaces."""
    run_dir = tmp_path / "my runs" / "exp $1"
    cfg = tmp_path / "c.toml"
    cfg.write_text('[job]\nprofile = "cpu"\n')
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "exatrain.cli.main",
            "submit",
            "-c",
            str(cfg),
            "--dry-run",
            f"--run.dir={run_dir}",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    line = next(ln for ln in done.stderr.splitlines() if "dry run" in ln)
    command = line.split("then run: ", 1)[1]
    assert shlex.split(command) == ["sbatch", "--parsable", f"{run_dir}.sbatch"]


# --- point 3: partial nodes and shared partitions --------------------------------------------------------

# Seed slides (slurm-facts.md): the cores closest to each GCD, GCD 0..7 (core 0 of each CCD is reserved).
SEED_GCD_CORES = [(49, 55), (57, 63), (17, 23), (25, 31), (1, 7), (9, 15), (33, 39), (41, 47)]
SEED_MASKS = [hex(sum(1 << c for c in range(a, b + 1))) for a, b in SEED_GCD_CORES]


def _bind_line(text):
    return next((ln for ln in text.splitlines() if ln.startswith("srun --ntasks-per-node=")), "")


@pytest.mark.parametrize(
    ("spec", "masks"),
    [
        (dict(), True),  # standard-g, all 8 GCDs: whole node, masks
        (dict(gpus_per_node=4), False),  # standard-g, 4 of 8 GCDs: which GCDs is SLURM's choice
        (dict(partition="small-g", gpus_per_node=2), False),  # shared: the step holds 14 cores SLURM picked
        (dict(partition="small-g"), True),  # shared but all 8 GCDs x 7 = 56 usable cores
        (dict(partition="dev-g", cpus_per_task=6), False),  # 48 of 56 cores: not the masks' cores
    ],
)
def test_lumi_masks_only_where_the_job_holds_their_cores(spec, masks):
    text = render_sbatch(JobSpec(**spec), load_profile("lumi-g"), "runs/x")
    line = _bind_line(text)
    if masks:
        assert f"--cpu-bind=mask_cpu:{','.join(SEED_MASKS)}" in line
    else:
        assert "--cpu-bind" not in line
        assert "# --cpu-bind: no per-GPU masks:" in text and "SLURM binds each task" in text


# --- point 6: containers ---------------------------------------------------------------------------------


def _binds(script):
    words = shlex.split(next(ln for ln in script.splitlines() if " exec --bind=" in ln).rstrip("\\"))
    return [
        b.split(":")[0]
        for b in next(w for w in words if w.startswith("--bind="))[len("--bind=") :].split(",")
    ]


def _under(path, binds):
    from pathlib import Path

    return any(Path(path).is_relative_to(b) for b in binds)


@pytest.mark.parametrize("mode", ["srun", "torchrun"])
def test_every_path_the_ranks_use_lies_under_a_bind(tmp_path, monkeypatch, mode):
    """The rank command's --config and --run.dir, and every path of the configuration the ranks read (data,
    token cache, checkpoint, user profile; relative ones against the job's working directory) are bound."""
    import tomllib

    from exatrain.config import load_config
    from exatrain.slurm.submit import prepare

    work = tmp_path / "work"
    (work / "corpus").mkdir(parents=True)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "init.pt").write_text("x")
    profile = tmp_path / "site" / "mine.toml"
    profile.parent.mkdir()
    profile.write_text((PROFILE_DIR / "lumi-g.toml").read_text())
    monkeypatch.chdir(work)
    cfg = work / "job.toml"
    cfg.write_text(
        f'[run]\ndir = "/scratch/p/runs/exp1"\n[data]\nkind = "text"\npath = "corpus"\n'
        f'cache_dir = "{tmp_path}/tokens/new"\n[checkpoint]\ninit_from = "{tmp_path}/ckpt/init.pt"\n'
        f'[job]\nprofile = "../site/mine.toml"\nlaunch = "{mode}"\ncontainer_image = "/img/pt.sif"\n'
    )
    job = prepare(load_config(str(cfg), []))
    binds = _binds(job.script)
    command = shlex.split(
        " ".join(ln.rstrip("\\") for ln in job.script.splitlines() if "--config=" in ln or "--run.dir=" in ln)
    )
    used = [w.split("=", 1)[1] for w in command if w.startswith(("--config=", "--run.dir="))]
    resolved = tomllib.loads(job.config_text)
    used += [
        resolved["run"]["dir"],
        resolved["data"]["path"],
        resolved["data"]["cache_dir"],
        resolved["checkpoint"]["init_from"],
        resolved["job"]["profile"],
        str(job.run_dir.parent / ".cache" / "data"),
    ]  # the default token cache (train.run.cache_dir)
    assert len(used) >= 8
    for path in used:
        absolute = path if path.startswith("/") else str(work / path)
        assert _under(absolute, binds), (path, binds)
    # LUMI's container docs: the minimal bindings for MPI/RCCL over Slingshot
    for site in ("/var/spool/slurmd", "/opt/cray", "/usr/lib64/libcxi.so.1"):
        assert site in binds


# --- what a new user stumbled on -------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["squeue", "scancel", "scontrol", "sacct"])
def test_status_and_cancel_without_slurm_do_not_suggest_dry_run(tmp_path, command):
    """Only submit has --dry-run; status and cancel must not send the user to a flag they lack."""
    from exatrain.slurm.runner import CommandNotFound, SlurmRunner

    with pytest.raises(CommandNotFound) as exc:
        SlurmRunner(env={"PATH": str(tmp_path)})([command, "1"])
    assert "--dry-run" not in exc.value.hint and "login node" in exc.value.hint
    with pytest.raises(CommandNotFound) as exc:
        SlurmRunner(env={"PATH": str(tmp_path)})(["sbatch", "x"])
    assert "exatrain submit --dry-run" in exc.value.hint


def test_local_runs_choose_the_thread_count_per_worker():
    from exatrain.launch.local import agent_environment, threads_per_worker

    assert threads_per_worker(2, cores=8) == 4 and threads_per_worker(4, cores=2) == 1
    env = agent_environment(0, {"PATH": "/bin"}, nproc=2)
    assert env["OMP_NUM_THREADS"] == str(threads_per_worker(2))
    assert (
        agent_environment(0, {"OMP_NUM_THREADS": "3"}, nproc=2)["OMP_NUM_THREADS"] == "3"
    )  # the user's wins
    assert "OMP_NUM_THREADS" not in agent_environment(0, {}, nproc=1)
