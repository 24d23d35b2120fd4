"""Issue 22 items 6-8 in the rendered script: --requeue, alt_read paired with --network=disable_rdzv_get,
NCCL_NET only on several nodes, presets per LUMI container generation, node-wide GPUs on generic-nvidia; a
wrong [[presets]] / [multi_node_env] entry is named with a HINT when the profile loads.

Expected values come from the sources cited in lumi-g.toml (libfabric fi_cxi(7), HPE's RCCL guide, the
aws-ofi-rccl source, LUMI's AI guide), not from the renderer under test. The SLURM side (what sbatch does
with these flags) is in tests/slurm/test_site_presets.py.
"""

import dataclasses

import pytest

from exatrain.errors import ConfigError
from exatrain.slurm import JobSpec, bundled_profiles, load_profile, render_sbatch
from exatrain.slurm.profiles import PROFILE_DIR

ROCM7 = (
    "/appl/local/laifs/containers/lumi-multitorch-u24r70f21m50t210-20260415_130625/"
    "lumi-multitorch-full-u24r70f21m50t210-20260415_130625.sif"
)  # LUMI AI guide, May 2026
ROCM64 = (
    "/appl/local/laifs/containers/lumi-multitorch-u24r64f21m43t29-20260225_144743/"
    "lumi-multitorch-full-u24r64f21m43t29-20260225_144743.sif"
)  # LUMI AI guide, February 2026
OLD = "/appl/local/containers/sif-images/lumi-pytorch-rocm-6.2.4-python-3.12-pytorch-v2.7.1.sif"


def _exports(text):
    lines = [line for line in text.splitlines() if line.startswith("export ") and "=" in line]
    return dict(line[len("export ") :].split("=", 1) for line in lines if "ENV_" not in line.split("=")[0])


def _sbatch(text):
    return [line.split(" ", 1)[1] for line in text.splitlines() if line.startswith("#SBATCH ")]


def _lumi(**job):
    return render_sbatch(JobSpec(**job), load_profile("lumi-g"), "runs/x")


@pytest.mark.parametrize("profile", bundled_profiles())
@pytest.mark.parametrize("mode", ["srun", "torchrun"])
def test_every_script_that_requeues_itself_asks_to_be_requeueable(profile, mode):
    """Item 6: the tail runs `scontrol requeue`, which SLURM refuses for a job that is not requeueable."""
    text = render_sbatch(JobSpec(launch=mode, nodes=2), load_profile(profile), "runs/x")
    assert 'scontrol requeue "$SLURM_JOB_ID"' in text
    assert "--requeue" in _sbatch(text)


def test_no_requeue_in_extra_sbatch_is_refused_with_a_hint():
    with pytest.raises(ConfigError, match="contradicts the --requeue") as exc:
        JobSpec(extra_sbatch=("--no-requeue",))
    assert 'checkpoint.signals = ""' in exc.value.hint


@pytest.mark.parametrize("image", ["", OLD, ROCM64, ROCM7])
@pytest.mark.parametrize("nodes", [1, 2])
def test_alt_read_and_disable_rdzv_get_come_together(image, nodes):
    """Item 7: fi_cxi(7) and HPE: alt_read needs rdzv_get_en=0, per job through --network=disable_rdzv_get."""
    text = _lumi(nodes=nodes, container_image=image)
    alt_read = _exports(text).get("FI_CXI_RDZV_PROTO") == "alt_read"
    assert alt_read == ("--network=disable_rdzv_get" in _sbatch(text)), text


def test_a_job_that_drops_alt_read_drops_the_network_flag_too():
    text = _lumi(nodes=2, env=(("FI_CXI_RDZV_PROTO", "default"),))
    assert not any(f.startswith("--network") for f in _sbatch(text))


def test_a_users_network_flag_is_kept_when_it_disables_rdzv_get_and_refused_when_not():
    text = _lumi(nodes=2, extra_sbatch=("--network=single_node_vni,disable_rdzv_get",))
    network = [f for f in _sbatch(text) if f.startswith("--network")]
    assert network == ["--network=single_node_vni,disable_rdzv_get"]
    with pytest.raises(ConfigError, match="drops the --network=disable_rdzv_get") as exc:
        _lumi(nodes=2, extra_sbatch=("--network=single_node_vni",))
    assert "--network=single_node_vni,disable_rdzv_get" in exc.value.hint


@pytest.mark.parametrize("image", ["", OLD, ROCM7])
def test_nccl_net_pins_the_plugin_by_its_registered_name_on_several_nodes_only(image):
    """ROCm's aws-ofi-rccl registers "AWS Libfabric"; a pin on one node, where the plugin is not initialised,
    could only fail the job."""
    assert _exports(_lumi(nodes=2, container_image=image))["NCCL_NET"] == "'AWS Libfabric'"
    assert "NCCL_NET" not in _exports(_lumi(nodes=1, container_image=image))


def test_container_generation_decides_the_rccl_presets():
    """LUMI's AI guide: ROCm 6.4 image with NCCL_SOCKET_IFNAME and NCCL_NET_GDR_LEVEL (February 2026), the
    ROCm 7 image without any RCCL variable (May 2026). Interfaces stay in every job (gloo needs them)."""
    rocm7, rocm64, bare = (_exports(_lumi(nodes=2, container_image=i)) for i in (ROCM7, ROCM64, ""))
    rccl = ("NCCL_NET_GDR_LEVEL", "HSA_FORCE_FINE_GRAIN_PCIE")
    assert not {k for k in rocm7 if k.startswith("FI_") or k in rccl}
    for env in (rocm64, bare):
        assert env["NCCL_NET_GDR_LEVEL"] == "PHB" and env["FI_CXI_RDZV_PROTO"] == "alt_read"
    for env in (rocm7, rocm64, bare):
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "hsn0,hsn1,hsn2,hsn3"
    assert "# Container generation: LUMI AI Factory images, ROCm 7." in _lumi(container_image=ROCM7)


def test_container_gets_the_generation_presets():
    text = _lumi(nodes=2, container_image=OLD)
    for name in ("FI_CXI_RDZV_PROTO", "NCCL_NET", "NCCL_NET_GDR_LEVEL"):
        assert f'export SINGULARITYENV_{name}="${name}"' in text


@pytest.mark.parametrize("mode", ["srun", "torchrun"])
@pytest.mark.parametrize("command", [(), ("python", "train.py"), ("bash", "run.sh")])
def test_generic_nvidia_gives_every_rank_the_whole_node(mode, command):
    """Item 8: NVIDIA/nccl#1066, NCCL needs every GPU of the node visible: no --gpus-per-task."""
    job = JobSpec(launch=mode, nodes=2, **({"command": command} if command else {}))
    flags = _sbatch(render_sbatch(job, load_profile("generic-nvidia"), "runs/x"))
    assert "--gpus-per-node=4" in flags and not any(f.startswith("--gpus-per-task") for f in flags)


def _profile_with(tmp_path, text, base="lumi-g"):
    path = tmp_path / "site.toml"
    path.write_text((PROFILE_DIR / f"{base}.toml").read_text() + "\n" + text)
    return str(path)


@pytest.mark.parametrize(
    "text, match, hint",
    [
        ('[[presets]]\nname = "x"\nimage = ["*"]\n', "unknown key", "images"),
        ('[[presets]]\nname = "x"\nimages = "/appl/*"\n', "images must be a non-empty list", '"" stands for'),
        ('[[presets]]\nimages = ["*"]\n', "name must be a non-empty string", "container generation"),
        (
            '[[presets]]\nname = "x"\nimages = ["*"]\n[presets.env]\nNCCL_NET = "AWS Libfabric"\n',
            "sets NCCL_NET",
            "[multi_node_env]",
        ),
        (
            '[[presets]]\nname = "x"\nimages = ["*"]\n[presets.env]\nFI_CXI_RDZV_PROTO = 1\n',
            "must be a table of strings",
            "quote numbers",
        ),
    ],
)
def test_wrong_preset_entries_are_named_with_a_hint(tmp_path, text, match, hint):
    with pytest.raises(ConfigError, match=match) as exc:
        load_profile(_profile_with(tmp_path, text))
    assert hint in exc.value.hint


def test_nccl_net_in_comm_env_is_refused(tmp_path):
    base = (PROFILE_DIR / "generic-nvidia.toml").read_text()
    path = tmp_path / "site.toml"
    path.write_text(base.replace("[comm_env]\n", '[comm_env]\nNCCL_NET = "IB"\n'))
    with pytest.raises(ConfigError, match=r"\[comm_env\] sets NCCL_NET") as exc:
        load_profile(str(path))
    assert "[multi_node_env]" in exc.value.hint


def test_first_matching_generation_wins_and_no_match_adds_nothing():
    profile = load_profile("lumi-g")
    only_rocm7 = dataclasses.replace(profile, presets=profile.presets[:1])
    text = render_sbatch(JobSpec(nodes=2, container_image="/project/me/own.sif"), only_rocm7, "runs/x")
    assert "FI_CXI_RDZV_PROTO" not in _exports(text) and "# Container generation" not in text


def test_a_refused_requeue_keeps_the_exit_code_and_says_how_to_go_on(tmp_path):
    """Stand-ins for srun (the rank exits 75) and scontrol (refuses, as SLURM does for a job that is not
    requeueable); the real refusal is in tests/slurm/test_site_presets.py."""
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\ncase "$*" in *exatrain*) exit 75;; esac\nexit 0\n')
    (bin_dir / "scontrol").write_text(
        "#!/bin/bash\necho 'Requested operation is presently disabled' >&2\nexit 1\n"
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(render_sbatch(JobSpec(), load_profile("cpu"), str(tmp_path / "run")))
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
    assert r.returncode == 75, r.stderr
    assert "SLURM refused to requeue job 4242" in r.stderr
    assert any(line.startswith("HINT: submit it again") for line in r.stderr.splitlines()), r.stderr


def test_a_job_without_the_plugin_overrides_the_pin_with_nccl_socket():
    """lumi-g.md: job.env NCCL_NET = "Socket" (NCCL's own TCP transport) wins over [multi_node_env]."""
    text = _lumi(nodes=2, env=(("NCCL_NET", "Socket"),))
    exports = [line for line in text.splitlines() if line.startswith("export NCCL_NET=")]
    assert exports == ["export NCCL_NET='AWS Libfabric'", "export NCCL_NET=Socket"]  # the last one counts


@pytest.mark.parametrize("image", ["", OLD, ROCM64, ROCM7])
def test_lumi_container_jobs_set_what_the_bindings_module_sets(image):
    """Issue 22 item 4: lumi-aif-singularity-bindings sets SLURM_MPI_TYPE=pmi2 besides its binds; container
    jobs of either image generation export it before their sruns, a job without a container does not."""
    text = _lumi(container_image=image, nodes=2)
    exported = _exports(text).get("SLURM_MPI_TYPE")
    assert exported == ("pmi2" if image else None)
    if image:
        first_srun = text.index("\nsrun ")
        assert text.index("export SLURM_MPI_TYPE=pmi2") < first_srun


def test_container_env_is_only_for_container_jobs_in_every_profile():
    """A profile's [container_env] never leaks into a job without a container."""
    for name in bundled_profiles():
        profile = load_profile(name)
        text = render_sbatch(JobSpec(nodes=2), profile, "runs/x")
        assert not set(dict(profile.container_env)) & set(_exports(text)), name
