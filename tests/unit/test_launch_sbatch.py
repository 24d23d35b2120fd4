"""sbatch rendering: golden files for every bundled profile x launch mode, bash syntax, hostile values.

Golden files live in tests/unit/golden/<profile>-<mode>.sbatch. After an intended change of the
rendering, regenerate them with ``EXATRAIN_UPDATE_GOLDEN=1 python -m pytest
tests/unit/test_launch_sbatch.py``: that run writes the files and FAILS ("golden files rewritten; review the
diff"), so a regeneration can never pass unnoticed; review the diff, then run again without the variable.
"""

import dataclasses
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from exatrain.errors import ConfigError
from exatrain.slurm import JobSpec, bundled_profiles, load_profile, render_sbatch, sbatch_flags
from tests.unit.goldens import check_golden
from tests.unit.lumi_gcd import gcd_mask

GOLDEN = Path(__file__).with_name("golden")
HOSTILE = "a'b\"c $(touch /tmp/pwned) d"
SPEC = JobSpec(
    nodes=2,
    time="01:30:00",
    account="project_465000123",
    name="golden",
    env=(("EXTRA_FLAG", "on"),),
    extra_sbatch=("--exclusive",),
)


def _render(profile, mode, **changes):
    return render_sbatch(
        dataclasses.replace(SPEC, launch=mode, **changes), load_profile(profile), "runs/golden"
    )


@pytest.mark.parametrize("mode", ["srun", "torchrun"])
@pytest.mark.parametrize("profile", bundled_profiles())
def test_golden(profile, mode):
    text = _render(profile, mode)
    path = GOLDEN / f"{profile}-{mode}.sbatch"
    check_golden(path, text)


def test_every_profile_has_goldens():
    assert len(bundled_profiles()) == 6
    assert sorted(GOLDEN.glob("*.sbatch")) == sorted(
        GOLDEN / f"{p}-{m}.sbatch" for p in bundled_profiles() for m in ("srun", "torchrun")
    )


@pytest.mark.parametrize("container", ["", "/images/pytorch.sif"])
@pytest.mark.parametrize("mode", ["srun", "torchrun"])
@pytest.mark.parametrize("profile", bundled_profiles())
def test_bash_syntax(tmp_path, profile, mode, container):
    script = tmp_path / "job.sbatch"
    script.write_text(_render(profile, mode, container_image=container, container_binds=("/scratch",)))
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_flags_sorted_and_deterministic():
    flags = sbatch_flags(SPEC, load_profile("lumi-g"))
    assert flags == sorted(flags, key=lambda f: (f.split("=")[0], f))
    assert "--open-mode=append" in flags and "--exclusive" in flags


_RENDER_ALL = """
import dataclasses, json, sys
from tests.unit.test_launch_sbatch import SPEC, _render
from exatrain.slurm import bundled_profiles
json.dump({f"{p}-{m}": _render(p, m) for p in bundled_profiles() for m in ("srun", "torchrun")}, sys.stdout)
"""


@pytest.mark.parametrize("hash_seed", ["1", "4242"])
def test_render_is_the_same_in_a_new_interpreter_with_another_hash_seed(hash_seed):
    """Set and dict-of-set iteration order changes with PYTHONHASHSEED; a fresh interpreter with another
    seed must render every profile x mode byte for byte as this process does."""
    import json
    import sys

    here = {f"{p}-{m}": _render(p, m) for p in bundled_profiles() for m in ("srun", "torchrun")}
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    out = subprocess.run(
        [sys.executable, "-c", _RENDER_ALL],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).parents[2],
        check=True,
    ).stdout
    assert json.loads(out) == here


def test_lumi_srun_has_masks_presets_and_caches():
    text = _render("lumi-g", "srun")
    bind = re.search(r"--cpu-bind=mask_cpu:([0-9a-fx,]+)", text)
    assert bind, "no --cpu-bind mask list in the LUMI script"
    assert [int(m, 16) for m in bind.group(1).split(",")] == [
        gcd_mask(g) for g in range(8)
    ]  # local rank = GCD
    for line in (
        "export NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3",
        "export NCCL_NET_GDR_LEVEL=PHB",
        "export FI_CXI_RDZV_PROTO=alt_read",
        "export HSA_FORCE_FINE_GRAIN_PCIE=1",
        'export MIOPEN_USER_DB_PATH="$NODE_CACHE"/miopen',
        "#SBATCH --ntasks-per-node=8",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --signal=USR2@120",
        "set -euo pipefail",
    ):
        assert line in text
    assert "rocm-smi" in text and "command -v" in text


def test_torchrun_mode_rendezvous():
    text = _render("juwels-booster", "torchrun")
    assert "--rdzv-backend=c10d" in text and '--rdzv-id="$SLURM_JOB_ID"' in text
    assert '--rdzv-endpoint="$RDZV_HEAD"i:"$RDZV_PORT"' in text  # JSC: InfiniBand name
    assert "#SBATCH --ntasks-per-node=1" in text and "#SBATCH --cpus-per-task=48" in text
    assert "scontrol show" not in text


def test_rendezvous_one_liner_expands_node_list(tmp_path):
    """The torchrun script's Python one-liner prints the first host and the job's derived port."""
    text = _render("generic-nvidia", "torchrun")
    line = next(ln for ln in text.splitlines() if ln.startswith("RDZV=$("))
    script = f'SLURM_JOB_NODELIST="nid[005002-005003]" SLURM_JOB_ID=4242\n{line}\necho "$RDZV"\n'
    out = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[2],
        env={**os.environ, "PATH": os.path.dirname(__import__("sys").executable) + ":" + os.environ["PATH"]},
    )
    from exatrain.env.ports import derive_port

    assert out.stdout.strip() == f"nid005002 {derive_port('4242')}", out.stderr


def test_container_propagates_environment():
    text = _render("lumi-g", "srun", container_image="/images/my image.sif")
    assert 'export SINGULARITYENV_NCCL_SOCKET_IFNAME="$NCCL_SOCKET_IFNAME"' in text
    assert "singularity exec" in text and "'/images/my image.sif'" in text
    assert 'export APPTAINERENV_OMP_NUM_THREADS="$OMP_NUM_THREADS"' in _render(
        "generic-nvidia", "srun", container_image="/i.sif"
    )


def _shell_words(text):
    """Every single-quoted shell word of the script body (after the #SBATCH header)."""
    return re.findall(r"'(?:[^']|'\"'\"')*'", text)


def test_hostile_values_are_inert(tmp_path):
    marker = tmp_path / "pwned"
    hostile = HOSTILE.replace("/tmp/pwned", str(marker))
    name = HOSTILE.replace(
        "/tmp/pwned", "pwned"
    )  # no '/' in a job name; run in tmp_path, it would touch marker
    spec = dataclasses.replace(
        SPEC,
        name=name,
        env=(("NOTE", hostile),),
        container_image=f"/img/{hostile}.sif",
        command=("echo", hostile),
    )
    run_dir = f"runs/{hostile}"
    text = render_sbatch(spec, load_profile("generic-nvidia"), run_dir)
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    for value in (hostile, run_dir, f"/img/{hostile}.sif"):
        quoted = shlex.quote(value)
        assert quoted in text
        out = subprocess.run(
            ["bash", "-c", f"printf %s {quoted}"], capture_output=True, text=True, cwd=tmp_path
        )
        assert out.stdout == value
    # The RUN_DIR and export lines, executed for real, keep the value literally.
    lines = [ln for ln in text.splitlines() if ln.startswith(("RUN_DIR=", "export NOTE="))]
    out = subprocess.run(
        ["bash", "-c", "\n".join(lines) + '\nprintf "%s|%s" "$RUN_DIR" "$NOTE"'],
        capture_output=True,
        text=True,
    )
    assert out.stdout == f"{run_dir}|{hostile}"
    # The #SBATCH line is double-quoted for sbatch's own parser and stays on one line.
    name_line = next(ln for ln in text.splitlines() if ln.startswith("#SBATCH --job-name="))
    assert name_line == '#SBATCH --job-name="a\'b\\"c $(touch pwned) d"'
    assert not marker.exists()


def test_newline_in_value_rejected():
    with pytest.raises(ConfigError, match="control character") as exc:
        JobSpec(name="x\n#SBATCH --nodes=100")
    assert "HINT:" in str(exc.value)


def test_too_many_gpus_rejected():
    with pytest.raises(ConfigError, match="exceeds the 8 GPUs") as exc:
        _render("lumi-g", "srun", gpus_per_node=16)
    assert "HINT:" in str(exc.value)


@pytest.mark.parametrize("exit_code, requeued", [(75, True), (0, False), (3, False)])
def test_exit_code_75_requeues_from_the_batch_shell(tmp_path, exit_code, requeued):
    """Runs a rendered script with stand-ins for srun and scontrol on PATH (only their exit codes and
    arguments matter here; the real requeue path is tested on the SLURM testbed in tests/slurm)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(f'#!/bin/bash\ncase "$*" in *exatrain*) exit {exit_code};; esac\nexit 0\n')
    (bin_dir / "scontrol").write_text(f'#!/bin/bash\necho "$*" >> {tmp_path}/scontrol.log\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(render_sbatch(SPEC, load_profile("cpu"), str(tmp_path / "run")))
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "j",
        "SLURM_JOB_NODELIST": "n1",
        "SLURM_NNODES": "1",
        "SLURM_CPUS_PER_TASK": "1",
        "USER": "u",
    }
    r = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == exit_code, r.stderr
    log = tmp_path / "scontrol.log"
    assert (log.read_text().split() == ["requeue", "4242"]) if requeued else not log.exists()
