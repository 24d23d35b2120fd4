"""`exatrain run`'s reading of other frameworks' scripts (exatrain/launch/peers.py) and its statements of
their rules (exatrain/env/peers.py): the self-spawn detection on the import forms PyTorch's tutorials use,
and the Lightning srun rule compared with Lightning's own check (lightning 2.6's SLURMEnvironment, run on
the same variables), so a Lightning release that changes the rule fails here."""

import ast
import os
import re
from importlib import metadata
from unittest import mock

import pytest
from packaging.requirements import Requirement

from exatrain.env.peers import accelerate_cpu_problem, lightning_srun_problem
from exatrain.errors import ExatrainError
from exatrain.launch import peers
from exatrain.slurm import JobSpec, bundled_profiles, load_profile, render_sbatch
from tests.conftest import ROOT


def _tree(source: str) -> ast.Module:
    return ast.parse(source)


@pytest.mark.parametrize(
    "source",
    [
        "import torch.multiprocessing as mp\n\nmp.spawn(f, nprocs=2)\n",
        "import torch\n\ntorch.multiprocessing.spawn(f, nprocs=2)\n",
        "import torch.multiprocessing\n\ntorch.multiprocessing.start_processes(f, nprocs=2)\n",
        "from torch import multiprocessing as tmp\n\ntmp.spawn(f)\n",
        "from torch.multiprocessing import spawn\n\nspawn(f)\n",
        "from torch.multiprocessing import start_processes as go\n\ngo(f)\n",
        "import torch as T\n\nif __name__ == '__main__':\n    T.multiprocessing.spawn(f)\n",
    ],
)
def test_spawn_calls_are_found(source):
    assert peers.spawn_line(_tree(source)) == source.count("\n", 0, source.index("(f")) + 1


@pytest.mark.parametrize(
    "source",
    [
        "import multiprocessing as mp\n\nmp.get_context('spawn').Process(target=f).start()\n",  # the stdlib's
        "import torch.multiprocessing as mp\n\nmp.set_start_method('spawn')\n",  # a DataLoader setting
        "spawn(f)\n",  # a function of the script's own
        "import torch\n\nx.multiprocessing.spawn(f)\n",
    ],
)
def test_other_calls_are_not_spawns(source):
    assert peers.spawn_line(_tree(source)) is None


def test_unreadable_scripts_detect_nothing(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def (:\n")
    assert peers.parse_script(bad) is None and peers.parse_script(tmp_path / "missing.py") is None
    assert peers.spawn_line(None) is None and peers.imported_packages(None) == frozenset()


def test_imported_packages():
    tree = _tree(
        "import lightning as L\nfrom pytorch_lightning.strategies import DDPStrategy\n"
        "import os.path\nfrom . import local\n\ndef f():\n    import accelerate\n"
    )
    assert peers.imported_packages(tree) == {"lightning", "pytorch_lightning", "os", "accelerate"}


def test_self_spawning_nproc():
    assert peers.self_spawning_nproc(None, "t.py", 7) == (
        1,
        "t.py starts its own worker processes (torch.multiprocessing, line 7): running it once "
        "(--nproc 1); its processes form their own group",
    )
    assert peers.self_spawning_nproc(1, "t.py", 7) == (1, None)
    with pytest.raises(ExatrainError) as e:
        peers.self_spawning_nproc(4, "t.py", 7)
    assert "--nproc 4 would start 4 copies" in e.value.message and "--nproc 1 t.py" in e.value.hint


def _lightning_refuses(environ: dict) -> bool:
    """Lightning's own verdict: does SLURMEnvironment's srun check raise on these variables?"""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    with mock.patch.dict(os.environ, environ, clear=True):
        try:
            SLURMEnvironment._validate_srun_variables()
        except RuntimeError:
            return True
        return False


def _lightning_picks_slurm(environ: dict) -> bool:
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    with mock.patch.dict(os.environ, environ, clear=True), mock.patch("shutil.which", return_value=None):
        return not TorchElasticEnvironment.detect() and SLURMEnvironment.detect()


STEPS = {
    "srun -n 4 (no per-node count)": {"SLURM_NTASKS": "4", "SLURM_JOB_NAME": "train"},
    "srun --ntasks-per-node=2": {
        "SLURM_NTASKS": "4",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_JOB_NAME": "train",
    },
    "one task": {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "train"},
    "interactive job name": {"SLURM_NTASKS": "4", "SLURM_JOB_NAME": "interactive"},
    "bash job name": {"SLURM_NTASKS": "4", "SLURM_JOB_NAME": "bash"},
    "torchrun inside srun -n 2": {"SLURM_NTASKS": "2", "SLURM_JOB_NAME": "train", "TORCHELASTIC_RUN_ID": "1"},
    "no SLURM": {},
}


@pytest.mark.parametrize("name", list(STEPS))
def test_lightning_srun_rule_is_lightnings(name):
    environ = STEPS[name]
    lightning_refuses = _lightning_picks_slurm(environ) and _lightning_refuses(environ)
    assert (lightning_srun_problem(environ) is not None) == lightning_refuses
    assert lightning_refuses == (name == "srun -n 4 (no per-node count)")  # the table means what it says


def test_peer_warnings_name_the_fix():
    lightning = _tree("import lightning as L\n")
    notes = peers.peer_warnings(lightning, STEPS["srun -n 4 (no per-node count)"], 0, launched=True)
    assert len(notes) == 1 and "SLURM_NTASKS_PER_NODE is unset" in notes[0] and "\nHINT: " in notes[0]
    assert peers.peer_warnings(lightning, STEPS["srun -n 4 (no per-node count)"], 0, launched=False) == []
    assert (
        peers.peer_warnings(_tree("import torch\n"), STEPS["srun -n 4 (no per-node count)"], 0, launched=True)
        == []
    )
    accelerate = _tree("from accelerate import Accelerator\n")
    assert "HINT: export ACCELERATE_USE_CPU=1" in peers.peer_warnings(accelerate, {}, 0, launched=False)[0]
    assert peers.peer_warnings(accelerate, {}, 4, launched=False) == []  # GPUs: Accelerate needs nothing


@pytest.mark.parametrize("value, problem", [(None, True), ("1", False), ("True", False), ("false", True)])
def test_accelerate_cpu_rule(value, problem):
    environ = {} if value is None else {"ACCELERATE_USE_CPU": value}
    assert (accelerate_cpu_problem(environ, 0) is not None) == problem


def test_accelerate_cpu_rule_is_accelerates():
    """Accelerate's own choice on this CPU-only machine, with and without the variable (its PartialState's
    backend choice, not run further; AcceleratorState turns ACCELERATE_USE_CPU into its ``cpu`` argument)."""
    import torch
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, parse_flag_from_env

    if torch.cuda.is_available():
        pytest.skip("the rule is for nodes without GPUs")
    for extra in ({}, {"ACCELERATE_USE_CPU": "1"}):
        environ = {"LOCAL_RANK": "0", "WORLD_SIZE": "2", **extra}
        with mock.patch.dict(os.environ, environ, clear=True):
            cpu = parse_flag_from_env("ACCELERATE_USE_CPU")
            _, kind = PartialState._prepare_backend(object.__new__(PartialState), cpu=cpu)
        assert kind in (DistributedType.NO, DistributedType.MULTI_CPU)
        assert (accelerate_cpu_problem(environ, 0) is not None) == (kind == DistributedType.NO)


@pytest.mark.parametrize("package", ["accelerate", "lightning"])
def test_peers_in_the_test_extra_keep_the_installed_torch(package):
    torch_release = metadata.version("torch").split("+")[0]
    pins = [Requirement(r) for r in metadata.requires(package) or []]
    torch_pins = [r for r in pins if r.name == "torch" and r.marker is None]
    assert torch_pins and all(r.specifier.contains(torch_release) for r in torch_pins)
    assert f'"{package}=={metadata.version(package)}"' in (ROOT / "pyproject.toml").read_text()


@pytest.mark.parametrize("profile", bundled_profiles())
def test_srun_mode_scripts_use_the_form_lightning_accepts(profile):
    """docs/peers.md: the srun line `exatrain submit` writes names --ntasks-per-node, so SLURM_NTASKS_PER_NODE
    is set in every task and Lightning's SLURMEnvironment accepts the step."""
    spec = JobSpec(nodes=2, time="01:00:00", account="a", launch="srun", command=("python", "train.py"))
    text = render_sbatch(spec, load_profile(profile), "runs/x")
    steps = [line for line in text.splitlines() if line.startswith("srun ") and "--cpus-per-task" in line]
    assert steps and all(re.search(r"--ntasks-per-node=\d+", line) for line in steps), text


def test_agent_keeps_its_store_to_itself_for_self_spawning_scripts():
    from exatrain.launch.local import agent_environment

    assert agent_environment(0, base={}, own_store=True)["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in agent_environment(0, base={})
