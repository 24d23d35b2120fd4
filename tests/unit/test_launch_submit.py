"""Submission, --test-only, status and cancel through a FAKE runner (no SLURM cluster in unit tests: the fake
records the commands and answers like Slurm 22.05 does; tests/slurm runs the same code on real daemons),
job arrays for sweeps, and the CLI paths sbatch/cost/submit/status/cancel."""

import re
import subprocess

import pytest

from exatrain.cli import commands
from exatrain.cli.main import build_parser, main
from exatrain.config import load_config
from exatrain.errors import ConfigError, ExatrainError
from exatrain.slurm.runner import CommandResult, SlurmRunner
from exatrain.slurm.submit import cancel, check_schedulable, prepare, status, submit
from exatrain.slurm.sweep import parse_sweep


class FakeRunner:
    """Stands in for SlurmRunner: answers from a table keyed by command name, records every call."""

    def __init__(self, **answers):
        self.answers = answers
        self.calls = []

    def __call__(self, args, *, input=None, cwd=None):
        self.calls.append((list(args), input, cwd))
        answer = self.answers.get(args[0], (0, "", ""))
        return CommandResult(*answer)


def _cfg(tmp_path, *overrides):
    return load_config(
        None,
        [
            f"--run.dir={tmp_path}/runs/exp",
            "--job.profile=cpu",
            "--job.gpus_per_node=2",
            "--job.nodes=2",
            *overrides,
        ],
    )


def test_submit_writes_script_and_config_next_to_run_dir(tmp_path):
    runner = FakeRunner(sbatch=(0, "4242\n", ""))
    job = prepare(_cfg(tmp_path))
    assert submit(job, runner) == "4242"
    script, config = tmp_path / "runs" / "exp.sbatch", tmp_path / "runs" / "exp.toml"
    assert script.read_text() == job.script and config.is_file()
    assert runner.calls == [(["sbatch", "--parsable", str(script)], None, None)]  # from the user's directory
    assert f"--config={config}" in job.script and f"--run.dir={tmp_path}/runs/exp" in job.script
    assert f"#SBATCH --output={tmp_path}/runs/%x-%j.out" in job.script  # output beside the run dir
    # the ranks read the same configuration back (paths made absolute)
    assert load_config(str(config)) == load_config(
        None,
        [
            f"--run.dir={tmp_path}/runs/exp",
            "--job.profile=cpu",
            "--job.gpus_per_node=2",
            "--job.nodes=2",
            f"--job.output={tmp_path}/runs/%x-%j.out",
        ],
    )
    assert job.output_paths("4242") == (f"{tmp_path}/runs/exatrain-4242.out",) * 2
    array = prepare(
        _cfg(tmp_path, "--job.output=%x-%A_%a-%j.out", "--job.error=e%%%j"), parse_sweep(["train.seed=1,2"])
    )
    assert array.output_paths("9") == (
        f"{tmp_path}/runs/exatrain-9_%a-%j.out",
        f"{tmp_path}/runs/e%%%j",
    )  # still patterns


def test_sbatch_failure_is_a_readable_error(tmp_path):
    runner = FakeRunner(
        sbatch=(1, "", "sbatch: error: Invalid account or account/partition combination specified\n")
    )
    with pytest.raises(ExatrainError, match="would not submit the job: Invalid account") as e:
        submit(prepare(_cfg(tmp_path)), runner)
    assert "job.account" in e.value.hint


def test_test_only_accepts_and_rejects(tmp_path):
    job = prepare(_cfg(tmp_path))
    ok = FakeRunner(
        sbatch=(0, "", "sbatch: Job 7 to start at 2026-11-23T00:00:00 using 4 processors on nodes n[1-2]\n")
    )
    assert check_schedulable(job, ok).startswith("Job 7 to start at")
    assert ok.calls == [(["sbatch", "--test-only"], job.script, None)]  # script on stdin: nothing written
    assert not (tmp_path / "runs").exists()
    bad = FakeRunner(
        sbatch=(
            1,
            "",
            "allocation failure: Requested node configuration is not available\n"
            "sbatch: error: Batch job submission failed: Requested node configuration is not available\n",
        )
    )
    with pytest.raises(ExatrainError, match="would not schedule the job: Batch job submission failed") as e:
        check_schedulable(job, bad)
    assert "sinfo" in e.value.hint and "job.nodes" in e.value.hint
    limits = FakeRunner(sbatch=(1, "", "allocation failure: More processors requested than permitted\n"))
    with pytest.raises(ExatrainError, match="More processors requested than permitted") as e:
        check_schedulable(job, limits)
    assert "partition's nodes and cores" in e.value.hint and "job.nodes" in e.value.hint


def test_status_running_finished_and_unknown():
    running = FakeRunner(squeue=(0, "  4242  exatrain  RUNNING  0:05  2 node[1-2]\n", ""))
    assert "RUNNING" in status(running, "4242") and running.calls[0][0][:3] == [
        "squeue",
        "--noheader",
        "--format=%.18i %.24j %.10T %.10M %.6D %R",
    ]
    done = FakeRunner(
        squeue=(1, "", "slurm_load_jobs error: Invalid job id specified"),
        scontrol=(
            0,
            "JobId=4242 JobName=x JobState=COMPLETED ExitCode=0:0 RunTime=00:00:09 NodeList=node[1-2]\n",
            "",
        ),
    )
    assert status(done, "4242") == "job 4242 (x): COMPLETED, exit code 0:0, ran 00:00:09 on node[1-2]"
    gone = FakeRunner(squeue=(1, "", ""), scontrol=(1, "", ""), sacct=(1, "", ""))
    with pytest.raises(ExatrainError, match="knows no job 99"):
        status(gone, "99")
    broken = FakeRunner(squeue=(1, "", "Unable to contact slurm controller"))
    with pytest.raises(ExatrainError, match="squeue failed: Unable to contact"):
        status(broken)


def test_cancel():
    runner = FakeRunner()
    cancel(runner, "4242_1")
    assert runner.calls[0][0] == ["scancel", "4242_1"]
    with pytest.raises(ExatrainError, match="not a SLURM job id"):
        cancel(runner, "4242; rm -rf /")
    with pytest.raises(ExatrainError, match="scancel 5 failed: Kill job error"):
        cancel(
            FakeRunner(
                scancel=(1, "", "scancel: error: Kill job error on job id 5: Invalid job id specified")
            ),
            "5",
        )


def test_sweep_renders_job_array(tmp_path):
    sweep = parse_sweep(["train.lr=1e-3,3e-3", "train.seed=1,2"])
    assert sweep.size == 2 and sweep.overrides(1) == ["--train.lr=3e-3", "--train.seed=2"]
    script = prepare(_cfg(tmp_path), sweep).script
    assert "#SBATCH --array=0-1" in script
    assert 'RUN_DIR="$RUN_DIR"/array-"$SLURM_ARRAY_TASK_ID"' in script
    assert (
        '--train.lr="${SWEEP_0[$SLURM_ARRAY_TASK_ID]}" --train.seed="${SWEEP_1[$SLURM_ARRAY_TASK_ID]}"'
        in script
    )
    # what the batch shell makes of it in array task 1
    lines = [ln for ln in script.splitlines() if ln.startswith(("RUN_DIR", "SWEEP_"))]
    out = subprocess.run(
        ["bash", "-c", "\n".join(lines) + '\necho "$RUN_DIR ${SWEEP_0[1]} ${SWEEP_1[1]}"'],
        env={"SLURM_ARRAY_TASK_ID": "1"},
        capture_output=True,
        text=True,
    )
    assert out.stdout.strip() == f"{tmp_path}/runs/exp/array-1 3e-3 2"
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


@pytest.mark.parametrize(
    ("specs", "match"),
    [
        (["train.lr"], "cannot read --array"),
        (["train.lr=1,2", "train.seed=1"], "different numbers of values"),
        (["train.lrr=1,2"], "unknown config key train.lrr"),
        (["train.steps=1,x"], "must be int"),
    ],
)
def test_bad_sweeps(specs, match):
    with pytest.raises(ConfigError, match=match) as e:
        parse_sweep(specs)
    assert e.value.hint


def test_runner_reports_missing_command():
    with pytest.raises(ExatrainError, match="sbatch not found") as e:
        SlurmRunner(env={"PATH": "/nonexistent"})(["sbatch", "--version"])
    assert "--dry-run" in e.value.hint


def _cli(command, *argv, runner=None):
    args, extra = build_parser().parse_known_args([command, *argv])
    return getattr(commands, f"cmd_{command}")(args, extra, runner=runner)


def test_cli_submit_prints_id_and_outputs(tmp_path, capsys):
    runner = FakeRunner(sbatch=(0, "77;cluster\n", ""))
    assert (
        _cli(
            "submit", f"--run.dir={tmp_path}/r", "--job.profile=cpu", "--job.output=%x-%j.log", runner=runner
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "submitted job 77" in out and f"stdout  {tmp_path}/exatrain-77.log" in out
    assert "exatrain status 77" in out


def test_cli_dry_run_submits_nothing(tmp_path, capsys):
    runner = FakeRunner()
    assert _cli("submit", "--dry-run", f"--run.dir={tmp_path}/r", "--job.profile=cpu", runner=runner) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("#!/bin/bash") and "would write" in captured.err
    assert runner.calls == [] and not (tmp_path / "r.sbatch").exists()


def test_cli_cost_and_sbatch(tmp_path, capsys):
    cfg = tmp_path / "job.toml"
    cfg.write_text(
        '[job]\nprofile = "lumi-g"\npartition = "small-g"\ngpus_per_node = 1\ncpus_per_task = 16\ntime = 60\n'
    )
    assert main(["cost", "-c", str(cfg)]) == 0
    out = capsys.readouterr().out
    # small-g: max(1 GCD, 16 cores / 8 = 2, 60 GB / 64) = 2 charged GCDs x 1 h x 0.5 = 1 GPU-hour
    assert (
        out.startswith("1 GPU-hours on small-g (rule gpu-slot")
        and "ADVICE:" in out
        and "7 cores and 60 GB" in out
    )
    assert (
        main(
            [
                "cost",
                "-c",
                str(cfg),
                "--job.partition=standard-g",
                "--job.gpus_per_node=8",
                "--job.cpus_per_task=0",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.startswith("4 GPU-hours on standard-g")  # 1 node x 1 h x 4
    assert main(["sbatch", "-c", str(cfg), "--job.nodes=3"]) == 0
    assert re.search(r"^#SBATCH --nodes=3$", capsys.readouterr().out, re.M)


def test_cli_bad_job_value_is_an_error_with_hint(tmp_path, capsys):
    assert main(["sbatch", "--job.profile=cpu", "--job.launch=mpirun"]) == 2
    err = capsys.readouterr().err
    assert "not a launch mode" in err and "HINT:" in err


def test_requeue_goes_through_the_same_runner():
    from exatrain.slurm.requeue import requeue_job

    runner = FakeRunner()
    assert requeue_job("42", runner) == (True, "job 42 requeued") and runner.calls[0][0] == [
        "scontrol",
        "requeue",
        "42",
    ]
    refused = FakeRunner(scontrol=(1, "", "scontrol: error: Job is no longer pending execution"))
    assert requeue_job("42", refused)[0] is False

    def no_scontrol(args, **kw):
        return SlurmRunner(env={"PATH": "/nonexistent"})(args, **kw)

    assert requeue_job("42", no_scontrol) == (False, "scontrol not found (container without SLURM tools?)")


def test_script_writes_the_config_and_hostile_values_stay_data(tmp_path):
    """The script is self-contained: it writes the ranks' config with a quoted here-document. A value with a
    newline and the here-document's end marker stays one TOML string; running the lines changes nothing
    else."""
    hostile = "x\nEXATRAIN_CONFIG_END\ntouch pwned\n$(touch pwned2) 'q' \"d\""
    job = prepare(_cfg(tmp_path, f"--data.path={hostile}"))
    lines = job.script.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("cat > "))
    end = lines.index("EXATRAIN_CONFIG_END", start)
    assert lines[start] == f"cat > {tmp_path}/runs/exp.toml <<'EXATRAIN_CONFIG_END'"
    assert subprocess.run(["bash", "-n"], input=job.script, text=True).returncode == 0
    (tmp_path / "runs").mkdir()  # the script's `mkdir -p -- "$RUN_DIR"` before it creates the parent
    r = subprocess.run(
        ["bash", "-c", "\n".join(lines[start : end + 1])], cwd=tmp_path, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "runs" / "exp.toml").read_text() == job.config_text
    assert load_config(str(tmp_path / "runs" / "exp.toml")).data.path == hostile
    assert not list(tmp_path.glob("pwned*"))
