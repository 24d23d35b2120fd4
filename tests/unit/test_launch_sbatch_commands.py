"""sbatch rendering of `[job] command`s: exatrain's trainer however it is spelled, a user's Python script
(wrapped in `exatrain run` in srun mode, left to torchrun in torchrun mode) and other programs.

Golden files of a script job live in tests/unit/golden/script/<profile>-<mode>.sbatch; regenerate them
after an intended change with ``EXATRAIN_UPDATE_GOLDEN=1 python -m pytest
tests/unit/test_launch_sbatch_commands.py`` and review the diff before committing.
"""

import dataclasses
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from exatrain.errors import ConfigError
from exatrain.slurm import JobSpec, load_profile, render_sbatch
from exatrain.slurm.profiles import PROFILE_DIR
from tests.unit.goldens import check_golden
from tests.unit.lumi_gcd import gcd_mask

GOLDEN = Path(__file__).with_name("golden") / "script"
SCRIPT_JOB = JobSpec(
    nodes=2,
    time="00:20:00",
    account="project_465000123",
    name="ddp",
    command=("python", "examples/torchrun_ddp/train.py", "--epochs", "3"),
)


def _launch_line(spec, profile="juwels-booster", config=("runs/x.toml", "[train]\n")):
    """The words of the rendered script's last launch line (the rank command and what precedes it there)."""
    text = render_sbatch(dataclasses.replace(spec, profile=profile), load_profile(profile), "runs/x", config)
    line = next(ln for ln in reversed(text.splitlines()) if ln.endswith("|| rc=$?"))
    return shlex.split(line.removesuffix(" || rc=$?")), text


@pytest.mark.parametrize("mode", ["srun", "torchrun"])
@pytest.mark.parametrize("profile", ["lumi-g", "juwels-booster", "generic-nvidia"])
def test_golden_script_job(profile, mode):
    spec = dataclasses.replace(SCRIPT_JOB, launch=mode, profile=profile)
    text = render_sbatch(spec, load_profile(profile), "runs/ddp")
    path = GOLDEN / f"{profile}-{mode}.sbatch"
    check_golden(path, text)
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


@pytest.mark.parametrize(
    "command",
    [
        ["exatrain", "train"],
        [".venv/bin/exatrain", "train"],
        ["/opt/venv/bin/exatrain", "train", "--train.steps=5"],
        ["python3", "-m", "exatrain.cli.main", "train"],
        ["/usr/bin/python3.11", "-m", "exatrain.cli.main", "train"],
        ["python", "-m", "exatrain", "train"],
    ],
)
def test_trainer_is_recognised_however_spelled(command):
    """The trainer keeps its own words and gets --config, --run.dir and JSC's master suffix, whatever
    the path or interpreter it is started with (`.venv/bin/exatrain train` used to lose all three)."""
    words, _ = _launch_line(JobSpec(nodes=2, command=tuple(command)))
    assert words[-len(command) - 3 :] == [
        *command,
        "--config=runs/x.toml",
        "--run.dir=runs/x",
        "--dist.master_suffix=i",
    ]


@pytest.mark.parametrize(
    "command, target",
    [
        (["python", "train.py", "--lr", "3e-4"], ["--", "train.py", "--lr", "3e-4"]),
        (["python3", "-u", "train.py"], ["--", "train.py"]),
        (["/opt/conda/bin/python3.11", "-m", "pkg.train", "--x"], ["-m", "pkg.train", "--x"]),
    ],
)
def test_python_command_is_wrapped_in_exatrain_run_in_srun_mode(command, target):
    """The same interpreter runs `exatrain run` with the profile (its master suffix and CPU masks); the
    script's own arguments stay after it; nothing is appended for exatrain's trainer."""
    words, text = _launch_line(JobSpec(nodes=2, command=tuple(command)))
    assert words[-len(target) - 5 :] == [
        command[0],
        "-m",
        "exatrain.cli.main",
        "run",
        "--profile=juwels-booster",
        *target,
    ]
    assert "--config=" not in " ".join(words)
    assert "`exatrain run` gives the script torchrun's variables" in text


def test_bare_script_is_wrapped_with_the_exatrain_command():
    words, _ = _launch_line(JobSpec(nodes=1, command=("train.py", "--epochs", "1")))
    assert words[-7:] == ["exatrain", "run", "--profile=juwels-booster", "--", "train.py", "--epochs", "1"]


def test_python_command_gets_its_variables_from_torchrun_in_torchrun_mode():
    """No `exatrain run` wrapper (torchrun sets RANK, ...): the same interpreter runs the script through the
    script runner; a bare script (run through its #! line) is left as it is."""
    words, text = _launch_line(
        JobSpec(nodes=2, launch="torchrun", command=("python", "train.py", "--lr", "1"))
    )
    assert words == ["python", "-u", "-m", "exatrain.launch.script_runner", "train.py", "--lr", "1"]
    assert "--no-python \\\n    python -u -m exatrain.launch.script_runner train.py" in text
    words, _ = _launch_line(JobSpec(nodes=2, launch="torchrun", command=("python3", "-m", "pkg.train")))
    assert words == ["python3", "-u", "-m", "exatrain.launch.script_runner", "-m", "pkg.train"]
    words, _ = _launch_line(JobSpec(nodes=2, launch="torchrun", command=("train.py", "--lr", "1")))
    assert words == ["train.py", "--lr", "1"]


@pytest.mark.parametrize(
    ("job", "masked"),
    [
        (dict(), True),  # standard-g, all 8 GCDs: whole nodes, masks
        (dict(gpus_per_node=4), False),  # 4 of 8 GCDs: the step need not hold the masks' cores
        (dict(partition="small-g", gpus_per_node=2), False),  # shared partition, part of a node
    ],
)
def test_torchrun_mode_passes_the_jobs_masks_to_the_script_runner(job, masked):
    """One task per node holds all its cores in torchrun mode: the script runner gets the masks of the job's
    GPUs (expected masks from the seed's GCD-to-CCD table, tests/unit/lumi_gcd.py) and binds each worker;
    where the job holds no masks' cores it gets none, and the script keeps its own arguments."""
    spec = JobSpec(launch="torchrun", command=("python", "train.py", "--lr", "1"), **job)
    words, text = _launch_line(spec, profile="lumi-g")
    after = words[words.index("exatrain.launch.script_runner") + 1 :]
    if masked:
        option, _, masks = after[0].partition("=")
        assert option == "--gpu-cpu-masks" and [int(m, 16) for m in masks.split(",")] == [
            gcd_mask(g) for g in range(8)
        ]
        assert after[1:] == ["train.py", "--lr", "1"]
        assert (
            "the script runner binds each\n# worker to the profile's mask of its GPU (--gpu-cpu-masks)"
            in text
        )
    else:
        assert after == ["train.py", "--lr", "1"]
        assert "# CPU binding: no per-GPU masks:" in text


def test_torchrun_mode_on_cpu_nodes_passes_one_mask_per_local_rank(tmp_path):
    """A CPU profile's masks are per local rank (--cpu-masks); the bundled `cpu` profile has none."""
    path = tmp_path / "pinned.toml"
    path.write_text(
        (PROFILE_DIR / "cpu.toml").read_text().replace("cpu_masks = []", 'cpu_masks = ["0x1", "0x2"]')
    )
    spec = JobSpec(launch="torchrun", gpus_per_node=2, command=("python", "-m", "pkg.train"))
    words, text = _launch_line(spec, profile=str(path))
    assert words[-4:] == ["exatrain.launch.script_runner", "--cpu-masks=0x1,0x2", "-m", "pkg.train"]
    assert "mask of its local rank (--cpu-masks)" in text
    words, _ = _launch_line(spec, profile="cpu")
    assert words[-3:] == ["exatrain.launch.script_runner", "-m", "pkg.train"]


def test_wrapped_script_sees_all_gpus_of_its_node():
    """A profile that binds one GPU per task would make cuda:LOCAL_RANK invalid for LOCAL_RANK > 0: a wrapped
    script gets --gpus-per-node instead; exatrain's trainer keeps the profile's --gpus-per-task."""
    per_task = dataclasses.replace(
        load_profile("generic-nvidia"), visibility="gpus-per-task"
    )  # a user's profile
    script = render_sbatch(dataclasses.replace(SCRIPT_JOB, profile="generic-nvidia"), per_task, "r")
    trainer = render_sbatch(JobSpec(nodes=2), per_task, "r")
    own = render_sbatch(JobSpec(nodes=2, command=("exatrain", "run", "t.py")), per_task, "r")
    assert "#SBATCH --gpus-per-node=4" in script and "--gpus-per-task" not in script
    assert "#SBATCH --gpus-per-node=4" in own  # the user's own `exatrain run` too
    assert "#SBATCH --gpus-per-task=1" in trainer


@pytest.mark.parametrize("command", [["sleep", "300"], ["bash", "run.sh"], ["exatrain", "run", "train.py"]])
def test_other_commands_run_as_given(command):
    words, text = _launch_line(JobSpec(nodes=1, command=tuple(command)))
    assert words[-len(command) :] == command and words.count("run") == command.count("run")
    if command[0] != "exatrain":
        assert "runs as\n# given, with only SLURM's variables" in text


def test_interpreter_options_are_refused_in_srun_mode():
    with pytest.raises(ConfigError, match="interpreter options such as '-X'") as exc:
        _launch_line(JobSpec(nodes=1, command=("python", "-X", "dev", "train.py")))
    assert "HINT:" in str(exc.value)
    words, _ = _launch_line(JobSpec(nodes=1, launch="torchrun", command=("python", "-X", "dev", "train.py")))
    assert words[-4:] == ["python", "-X", "dev", "train.py"]  # torchrun starts it as written


@pytest.mark.parametrize("name, profile", [("lumi-g", "lumi-g"), ("juwels-booster", "juwels-booster")])
def test_example_job_files_render(name, profile):
    """examples/torchrun_ddp's job files: the bundled profile, the script wrapped in `exatrain run` (srun
    mode) and in torchrun with --job.launch=torchrun; both scripts are valid bash."""
    from exatrain.config import load_config
    from exatrain.slurm.submit import prepare

    path = Path(__file__).parents[2] / "examples" / "torchrun_ddp" / f"{name}.toml"
    srun = prepare(load_config(str(path), [])).script
    torchrun = prepare(load_config(str(path), ["--job.launch=torchrun"])).script
    assert f"# Generated by exatrain: profile {profile}, launch mode srun." in srun
    assert f"python -m exatrain.cli.main run --profile={profile} -- examples/torchrun_ddp/train.py" in srun
    # the script runner, with the job's masks where it has some (lumi-g: whole nodes), starts the script
    assert re.search(
        r"--no-python \\\n    python -u -m exatrain.launch.script_runner (--gpu-cpu-masks=\S+ )?"
        r"examples/torchrun_ddp/train.py",
        torchrun,
    )
    for text in (srun, torchrun):
        assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


@pytest.mark.parametrize("mode", ["srun", "torchrun"])
def test_job_label_gives_the_script_its_rank_prefix(mode):
    """job.label = true: srun mode runs the script under `exatrain run --label`, torchrun mode under the
    script runner's --label (first of its options, before the CPU masks on LUMI-G); false leaves both out.
    tests/slurm/test_run_in_job.py checks the lines a real job then prints."""
    spec = dataclasses.replace(SCRIPT_JOB, launch=mode)
    for profile in ("juwels-booster", "lumi-g"):
        plain, _ = _launch_line(spec, profile)
        words, _ = _launch_line(dataclasses.replace(spec, label=True), profile)
        assert "--label" not in plain
        script = words.index("examples/torchrun_ddp/train.py")
        if mode == "srun":
            run = words.index("run")
            assert words[run + 1 : script] == [f"--profile={profile}", "--label", "--"], words
        else:
            runner = words.index("exatrain.launch.script_runner")
            options = words[runner + 1 : script]
            assert (
                options[0] == "--label"
                and options[1:]
                == plain[
                    plain.index("exatrain.launch.script_runner") + 1 : plain.index(
                        "examples/torchrun_ddp/train.py"
                    )
                ]
            ), words
        assert [w for w in words if w != "--label"] == plain


@pytest.mark.parametrize(
    "command,mode",
    [
        (("exatrain", "train"), "srun"),
        (("python", "-m", "exatrain.cli.main", "train"), "torchrun"),
        (("bash", "run.sh"), "srun"),
        (("train.py",), "torchrun"),  # torchrun starts a bare script itself: no runner to label it
    ],
)
def test_job_label_for_a_command_nothing_can_label_is_refused(command, mode):
    with pytest.raises(ConfigError, match="job.label = true, but job.command") as refused:
        dataclasses.replace(SCRIPT_JOB, command=command, launch=mode, label=True)
    assert "python" in refused.value.hint and "job.label = false" in refused.value.hint
