"""Bad input on the command line: non-zero exit, a message naming the input, a HINT, no traceback."""

import pytest

SLURM_STEP = {  # one task of `srun -N2 -n4`, as observed on the testbed
    "SLURM_JOB_ID": "77",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "0",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_NTASKS": "4",
    "SLURM_JOB_NODELIST": "node[1-2]",
}


def _empty_corpus(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    for split in ("train", "valid", "test"):
        (d / f"{split}.txt").write_text("\n \n")
    return d


CASES = {
    "malformed node list": (
        ["train"],
        {**SLURM_STEP, "SLURM_STEP_NODELIST": "node[1-"},
        "SLURM_STEP_NODELIST",
    ),
    "contradicting SLURM variables": (["train"], {**SLURM_STEP, "SLURM_PROCID": "7"}, "SLURM_PROCID"),
    "unknown config key": (["train", "--train.stepz=3"], {}, "train.stepz"),
    "wrong value type": (["train", "--train.steps=many"], {}, "train.steps"),
    "missing data directory": (
        ["train", "--data.kind=wikitext", "--data.path=/nonexistent/wt2"],
        {},
        "/nonexistent/wt2",
    ),
    "empty corpus": (["train", "--nproc=1", "--data.kind=wikitext", "--data.path={empty}"], {}, "empty"),
    "nproc 0": (["train", "--nproc=0"], {}, "--nproc"),
    "unknown model size": (["train", "--model.size=huge"], {}, "huge"),
    "batch not divisible": (
        ["train", "--nproc=2", "--train.global_batch_size=10", "--train.micro_batch_size=4"],
        {},
        "global_batch_size=10",
    ),
    "master port out of range (flag)": (["train", "--dist.master_port=80"], {}, "master_port"),
    "master port out of range (variable)": (["train"], {"MASTER_PORT": "99999"}, "MASTER_PORT"),
    "unknown argument": (["train", "--stepz", "5"], {}, "--stepz"),
    "config key without a value": (["train", "--train.steps"], {}, "--train.steps"),
    "more pipeline stages than blocks": (
        ["train", "--nproc=4", "--parallel.pp=4", "--parallel.dp_replicate=1"],
        {},
        "4 pipeline stages",
    ),
    "interleaved 1F1B with one stage per rank": (
        [
            "train",
            "--nproc=2",
            "--parallel.pp=2",
            "--parallel.dp_replicate=1",
            "--parallel.pp_schedule=interleaved_1f1b",
        ],
        {},
        "pp_stages_per_rank",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_explained(name, exatrain_cli, tmp_path):
    args, env, needle = CASES[name]
    if any("{empty}" in a for a in args):
        empty = str(_empty_corpus(tmp_path))
        args = [a.replace("{empty}", empty) for a in args]
    r = exatrain_cli(*args, f"--run.dir={tmp_path / 'run'}", env=env, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert needle in r.stderr, r.stderr
    assert "HINT:" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
