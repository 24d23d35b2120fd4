"""The job's torch decides what torchrun is asked for (docs/torch-versions.md): the version read from the
package metadata, the floor (pyproject.toml's), which torchrun options exist from which release, and the
command line a torchrun-mode script gives the agent, parsed by torch 2.4's torchrun (tests/torch24/run24.py,
the stand-in for the oldest torch pyproject allows) and by the installed 2.13's."""

import re
import shlex
from pathlib import Path

import pytest

from exatrain.env.torch_version import TORCH_FLOOR, check_torch_floor, parse_torch_version, torch_at_least
from exatrain.errors import ConfigError
from exatrain.launch.agent import prepare, split_options
from exatrain.slurm.profiles import load_profile
from exatrain.slurm.sbatch import render_sbatch
from exatrain.slurm.spec import JobSpec
from exatrain.slurm.torchrun_line import accepts, agent_options, native_signal_handling, signal_options

ROOT = Path(__file__).resolve().parents[2]
# The torchrun arguments c227ac3 rendered for lumi-g (its golden file; "$VAR" words as bash expands them).
C227AC3_LINE = (
    "--rdzv-conf=is_host=true --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d "
    "--rdzv-endpoint=nid001234:29517 --rdzv-id=7 "
    "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2 --shutdown-timeout=120 "
    "--no-python exatrain train --run.dir=runs/golden"
)


def test_the_floor_is_pyprojects():
    text = (ROOT / "pyproject.toml").read_text()
    floor = re.search(r'"torch>=([0-9.]+),<3"', text).group(1)
    assert TORCH_FLOOR == tuple(int(p) for p in floor.split("."))


@pytest.mark.parametrize(
    "text, want",
    [
        ("2.4.0", (2, 4, 0)),
        ("2.9.1+rocm6.4", (2, 9, 1)),
        ("2.10", (2, 10, 0)),
        ("2.7.0a0+git1234", (2, 7, 0)),
        ("2.13.0+cpu", (2, 13, 0)),
    ],
)
def test_versions_as_sites_spell_them(text, want):
    assert parse_torch_version(text) == want


def test_floor_check_names_version_and_floor():
    assert check_torch_floor((2, 4, 0)) == (2, 4, 0)
    with pytest.raises(ConfigError, match=r"torch 2\.3\.1 .* older than exatrain's floor 2\.4") as e:
        check_torch_floor((2, 3, 1), "/opt/venv/bin/python")
    assert "HINT: use torch>=2.4" in str(e.value) and "/opt/venv/bin/python" in str(e.value)
    with pytest.raises(ConfigError, match="no torch is installed"):
        check_torch_floor(None)
    assert check_torch_floor((2, 9, 1), trainer=True) == (2, 9, 1) and check_torch_floor((2, 8, 0)) == (
        2,
        8,
        0,
    )
    with pytest.raises(
        ConfigError, match=r"torch 2\.8\.0 .* older than 2\.9, the oldest torch exatrain's reference"
    ):
        check_torch_floor((2, 8, 0), trainer=True)


@pytest.mark.parametrize(
    "version, signals, timeout",
    [
        ((2, 4, 0), False, False),
        ((2, 9, 1), False, False),
        ((2, 10, 0), True, False),
        ((2, 11, 0), True, False),
        ((2, 12, 0), True, True),
        ((2, 13, 0), True, True),
    ],
)
def test_options_by_release(version, signals, timeout):
    """What the released wheels' torch/distributed/run.py accept (docs/torch-versions.md has the sources)."""
    assert accepts("--signals-to-handle", version) is signals
    assert accepts("--shutdown-timeout", version) is timeout
    assert accepts("--local-addr", version) and accepts("--rdzv-conf", version)
    assert native_signal_handling(version) is (signals and timeout)
    assert (signal_options(version, "USR2", 120) != []) is (signals and timeout)
    assert torch_at_least(version, (2, 12)) is timeout


def test_agent_options_leave_torchruns_own_signals_to_it():
    assert agent_options("TERM,USR2", 120) == ["--handle-signals=SIGUSR2", "--shutdown-grace=120"]
    assert agent_options("TERM, INT") == []
    assert split_options(
        ["--handle-signals=SIGUSR2", "--shutdown-grace=90", "--", "--standalone", "x.py"]
    ) == ("SIGUSR2", 90, ["--standalone", "x.py"])
    assert split_options(["--standalone", "x.py"]) == ("", None, ["--standalone", "x.py"])


def _rendered_agent_argv(profile="lumi-g"):
    """The agent's arguments of a rendered torchrun-mode script, as bash would pass them on node 0."""
    spec = JobSpec(nodes=2, time="01:30:00", launch="torchrun", signal="USR2@120", profile=profile)
    text = render_sbatch(spec, load_profile(profile), "runs/golden")
    lines = text.splitlines()
    at = next(
        i
        for i, line in enumerate(lines)
        if line.strip().startswith("bash -c '") and "exec python3 -m exatrain.launch.agent" in line
    )
    is_host = '"$([ "$SLURM_NODEID" = 0 ] && echo true || echo false)"'  # node 0's value
    script = shlex.split(lines[at].strip().rstrip("\\"))[2]
    script = script[script.index("exec python3") :]  # after the node's GLOO_SOCKET_IFNAME narrowing, if any
    inner = shlex.split(script.replace(is_host, "true"))
    assert inner[:4] == ["exec", "python3", "-m", "exatrain.launch.agent"] and inner[-1] == "$@"
    own = inner[4:-1]
    args = shlex.split(lines[at + 1].strip().rstrip("\\")) + shlex.split(
        lines[at + 2].removesuffix(" || rc=$?")
    )
    return own + args, text


def test_c227ac3_line_is_refused_by_torch_24s_torchrun(capsys):
    """What every older LUMI/JSC torch did with the old line (2.4's parser, argparse's own refusal)."""
    from tests.torch24.run24 import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(shlex.split(C227AC3_LINE))
    assert e.value.code == 2
    assert (
        "error: unrecognized arguments: --signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2 "
        "--shutdown-timeout=120"
    ) in capsys.readouterr().err


@pytest.mark.parametrize("profile", ["lumi-g", "juwels-booster", "cpu"])
def test_rendered_line_parses_on_torch_24_and_213(profile):
    """The same rendered script: torch 2.4's torchrun gets no option it lacks (the agent forwards USR2
    itself); torch 2.13's gets --signals-to-handle with SIGUSR2 and the signal's lead time."""
    from torch.distributed.run import parse_args as parse_213

    from tests.torch24.run24 import parse_args as parse_24

    argv, text = _rendered_agent_argv(profile)
    assert "--signals-to-handle" not in text.split("#SBATCH")[-1].split("srun --ntasks-per-node=1")[-1]
    old, forwarder = prepare(argv, (2, 4, 0))
    assert (
        forwarder is not None
        and [s.name for s in forwarder.signals] == ["SIGUSR2"]
        and forwarder.grace == 120
    )
    args = parse_24(old)
    assert (args.training_script, args.no_python, args.rdzv_conf) == ("exatrain", True, "is_host=true")
    new, forwarder = prepare(argv, (2, 13, 0))
    args = parse_213(new)
    assert (
        forwarder is None
        and args.signals_to_handle.split(",")[-1] == "SIGUSR2"
        and args.shutdown_timeout == 120
    )
    assert args.training_script == "exatrain"


def test_a_job_without_signal_asks_for_nothing():
    spec = JobSpec(nodes=1, time="10", launch="torchrun", profile="cpu", signal="")
    text = render_sbatch(spec, load_profile("cpu"), "runs/x")
    assert "exec python3 -m exatrain.launch.agent -- --rdzv-conf" in text
