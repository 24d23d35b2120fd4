"""Attaching to a running job from the login side (exatrain.slurm.attach), through a stand-in runner that
answers as Slurm 22.05's squeue and `scontrol write batch_script JOBID -` do (tests/slurm/test_dump_job.py
runs the same code against the real daemons)."""

import pytest

from exatrain.errors import ExatrainError
from exatrain.slurm import JobSpec, load_profile, render_sbatch
from exatrain.slurm.attach import job_nodes, job_run_dir, on_every_node
from exatrain.slurm.runner import CommandResult
from exatrain.slurm.sweep import parse_sweep


class Answers:
    """Stands in for SlurmRunner: answers by command name, records every call."""

    def __init__(self, **answers):
        self.answers, self.calls = answers, []

    def __call__(self, args, *, input=None):
        self.calls.append(list(args))
        return CommandResult(*self.answers.get(args[0], (0, "", "")))


def _script(run_dir: str, sweep=None) -> str:
    return render_sbatch(JobSpec(nodes=2), load_profile("cpu"), run_dir, sweep=sweep)


def test_the_run_directory_is_read_from_the_batch_script_exatrain_wrote():
    runner = Answers(scontrol=(0, _script("/scratch/p/runs/it's mine"), ""))
    assert job_run_dir(runner, "42") == "/scratch/p/runs/it's mine"  # the quoted path, unquoted
    assert runner.calls == [["scontrol", "write", "batch_script", "42", "-"]]


def test_an_array_tasks_run_directory_is_its_own():
    script = _script("/runs/sweep", parse_sweep(["train.seed=1,2,3"]))
    runner = Answers(scontrol=(0, script, ""), squeue=(0, "2\n", ""))
    assert job_run_dir(runner, "42_2") == "/runs/sweep/array-2"


def test_a_script_exatrain_did_not_write_is_refused_with_a_hint():
    with pytest.raises(ExatrainError) as e:
        job_run_dir(Answers(scontrol=(0, "#!/bin/bash\nsrun python train.py\n", "")), "42")
    assert "no run directory in its batch script" in str(e.value) and "exatrain dump RUN_DIR" in e.value.hint


@pytest.mark.parametrize(
    "answer, says",
    [
        ((0, "PENDING 2\n", ""), "job 7 is PENDING, not RUNNING"),
        ((1, "", "Invalid job id"), "not in the queue"),
    ],
)
def test_a_job_that_does_not_run_is_refused_with_a_hint(answer, says):
    with pytest.raises(ExatrainError) as e:
        job_nodes(Answers(squeue=answer), "7", what="no ranks to dump")
    assert says in str(e.value) and e.value.hint


def test_one_task_per_node_shares_the_jobs_resources():
    argv = on_every_node("7", 3, ["sh", "-c", "true"])
    assert argv[:2] == ["srun", "--overlap"] and "--jobid=7" in argv and "--ntasks-per-node=1" in argv
    assert "--nodes=3" in argv and "--ntasks=3" in argv and argv[-3:] == ["sh", "-c", "true"]
