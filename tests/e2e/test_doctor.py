"""`exatrain doctor` from the command line: a real gloo all_reduce sweep on 2 local ranks, and a failed
check (an unwritable cache directory) giving exit code 1 and a HINT."""

import re
import time

import pytest

from exatrain.tools.plan.estimate import TIME_KEYS

pytestmark = pytest.mark.e2e


def test_doctor_on_two_local_ranks(exatrain_cli, tmp_path):
    r = exatrain_cli("doctor", "--nproc=2", "--max-size=64KiB", "--iters=2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "exatrain doctor: 2 rank(s) on 1 node(s), backend gloo" in r.stdout
    sizes = re.findall(r"│\s+(\d+) KiB │\s+([\d,]+) us │\s+([\d.]+) │\s+([\d.]+) │", r.stdout)
    assert [int(kib) for kib, _, _, _ in sizes] == [1, 4, 16, 64]
    for kib, us, alg, bus in sizes:  # as printed: time to 1 us, bandwidths to 3 significant digits
        t_us = int(us.replace(",", ""))
        algbw = int(kib) * 1024 / (t_us * 1e-6) / 1e9  # nccl-tests: algbw = bytes / time
        assert float(alg) > 0 and float(alg) == pytest.approx(algbw, rel=0.6 / t_us + 0.006), (kib, us, alg)
        assert float(bus) == pytest.approx(float(alg) * 2 * (2 - 1) / 2, rel=0.01), (
            alg,
            bus,
        )  # x 2(n-1)/n, n = 2
    assert "doctor: all checks passed" in r.stdout
    # the hang settings a job gets by default (docs/hangs.md), and what a dump can use: gloo's flight
    # recorder, py-spy of the test extra
    assert (
        "hang settings: collective timeout 300 s ([dist] timeout_s); hang watcher derived from the first "
        "steps (max(10 x the median step, 300 s, the first step)); torch's flight recorder answers on 2 of "
        "2 rank(s); py-spy /"
    ) in r.stdout
    assert (
        "hang settings from: collective timeout: default ([dist] timeout_s = 300); hang watcher: default "
        "([run] hang_timeout_s = -1)\n"
    ) in r.stdout
    assert "WARNING: this job ends" not in r.stdout
    # the [hardware] lines to paste: a TOML table the site profile parses, the sweep's 64 KiB busbw as the
    # intra-node bandwidth (one node), a measured matmul rate
    hardware = _pasted_hardware(r.stdout)
    assert hardware.intra_node_busbw_gbs == pytest.approx(float(sizes[-1][3]), rel=0.01)
    assert hardware.matmul_tflops > 0 and hardware.missing(TIME_KEYS) == ["inter_node_busbw_gbs"]
    assert hardware.hbm_gbs > 0  # STREAM Add on each rank at once, the slowest
    assert hardware.source == "measured"
    # the fused attention kernel at the default CPU shape (no job config given): its own measured rate
    assert hardware.attention_tflops > 0
    assert "causal attention, 16 heads x 512 tokens x 64, forward + backward" in r.stdout
    # the user's next step: the printed table pasted into a copy of the cpu profile predicts a job on this
    # one node (no inter-node busbw needed there)
    from exatrain.slurm.profiles import PROFILE_DIR

    site = tmp_path / "here.toml"
    pasted = r.stdout[r.stdout.index("\n[hardware]\n") :]
    site.write_text((PROFILE_DIR / "cpu.toml").read_text() + pasted)
    plan = exatrain_cli("plan", f"--site={site}", "--world-size=2", "--time", "--model.size=tiny")
    assert plan.returncode == 0 and "predicted step:" in plan.stdout, plan.stderr
    assert "hardware constants: measured" in plan.stdout


def _pasted_hardware(stdout: str):
    """The doctor's printed [hardware] table, read as a copy of the LUMI-G profile with it pasted in."""
    from exatrain.config.load import read_toml
    from exatrain.slurm.profiles import PROFILE_DIR, profile_from_dict

    text = stdout[stdout.index("\n[hardware]\n") :]
    from exatrain.config.load import tomllib

    table = tomllib.loads(text)["hardware"]
    return profile_from_dict({**read_toml(str(PROFILE_DIR / "lumi-g.toml")), "hardware": table}).hardware


def test_doctor_fails_on_an_unwritable_cache(exatrain_cli):
    # (and warns that a job ending in 100 s ends before a hang could be detected: 300 s + the dump's 30 s)
    r = exatrain_cli(
        "doctor", "--nproc=1", "--cache-dir=/proc", env={"SLURM_JOB_END_TIME": str(int(time.time()) + 100)}
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert re.search(
        r"WARNING: this job ends in \d+ s, before a hang could be detected and dumped \(after 300 s \+ up "
        r"to 30 s\)\nHINT: set a hang timeout well below the time left: `exatrain run --hang-timeout \d+`",
        r.stdout,
    ), r.stdout
    assert "FAIL: rank 0 on " in r.stdout and "cache directory /proc is not writable" in r.stdout
    assert "HINT: " in r.stdout and "doctor: 1 check(s) failed" in r.stdout
    # the job's own settings: a 20 s hang timeout finds a hang well inside the 200 s left
    r = exatrain_cli(
        "doctor",
        "--nproc=1",
        "--hang-timeout=20",
        "--collective-timeout=600",
        env={"SLURM_JOB_END_TIME": str(int(time.time()) + 200)},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "hang settings: collective timeout 600 s ([dist] timeout_s); hang watcher 20 s;" in r.stdout
    assert "WARNING: this job ends" not in r.stdout
    r = exatrain_cli("doctor", "--nproc=1", "--nccl-log=missing.log")
    assert r.returncode == 2 and "exatrain: error: --nccl-log missing.log: no such file" in r.stderr, r.stderr
    assert "HINT: " in r.stderr and "Traceback" not in r.stderr


def test_the_hang_settings_of_a_config_file_with_their_sources(exatrain_cli, tmp_path):
    """`exatrain doctor -c FILE` reports the job's own [run] hang_timeout_s and [dist] timeout_s, says where
    each came from, lets a flag win over the file, and warns from the file's values in a job ending soon."""
    (tmp_path / "job.toml").write_text("[run]\nhang_timeout_s = 40\n\n[dist]\ntimeout_s = 90\n")
    r = exatrain_cli("doctor", "--nproc=1", "-c", "job.toml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "hang settings: collective timeout 90 s ([dist] timeout_s); hang watcher 40 s;" in r.stdout
    assert (
        "hang settings from: collective timeout: config file job.toml ([dist] timeout_s = 90); "
        "hang watcher: config file job.toml ([run] hang_timeout_s = 40)\n"
    ) in r.stdout
    assert "WARNING: this job ends" not in r.stdout  # no SLURM job: no time limit
    # a flag wins over the file (and says what it overrode), an override over the file
    r = exatrain_cli("doctor", "--nproc=1", "-c", "job.toml", "--hang-timeout=20", "--dist.timeout_s=600")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "hang settings: collective timeout 600 s ([dist] timeout_s); hang watcher 20 s;" in r.stdout
    assert (
        "hang settings from: collective timeout: override --dist.timeout_s=600; hang watcher: flag "
        "--hang-timeout 20, over config file job.toml ([run] hang_timeout_s = 40)\n"
    ) in r.stdout
    # a job ending in 60 s is warned about from the file's 40 s (not the default 300 s)
    end = {"SLURM_JOB_END_TIME": str(int(time.time()) + 60)}
    r = exatrain_cli("doctor", "--nproc=1", "-c", "job.toml", env=end)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"WARNING: this job ends in \d+ s, .* \(after 40 s \+ up to 30 s\)\nHINT: ", r.stdout)


@pytest.mark.parametrize(
    "toml, error",
    [
        (None, "config file 'job.toml' does not exist"),
        ("[run\n", "config file 'job.toml' is not valid TOML"),
        ('[dist]\ntimeout_s = "soon"\n', "config file 'job.toml': config key dist.timeout_s must be float"),
        (
            "[run]\nhang_timeout_s = 1\n",
            "config file job.toml ([run] hang_timeout_s = 1): a hang timeout must",
        ),
        (
            "[run]\nhang_timeout_s = -5\n",
            "config file job.toml ([run] hang_timeout_s = -5): negative, but not -1",
        ),
        ("[dist]\ntimeout_s = 0\n", "config file job.toml ([dist] timeout_s = 0): a collective timeout must"),
    ],
)
def test_a_bad_config_file_is_an_error_naming_it(exatrain_cli, tmp_path, toml, error):
    if toml is not None:
        (tmp_path / "job.toml").write_text(toml)
    r = exatrain_cli("doctor", "--nproc=2", "-c", "job.toml")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"exatrain: error: {error}" in r.stderr and "\nHINT: " in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "exatrain doctor:" not in r.stdout  # before any rank started


def test_failed_check_under_nproc_prints_the_doctor_and_no_launcher_traceback(exatrain_cli):
    """Under --nproc the workers run inside torchrun's agent: a failed check must end with the doctor's table,
    FAIL and HINT lines and exit 1, not with the agent's report of failed workers."""
    r = exatrain_cli("doctor", "--nproc=2", "--max-size=4KiB", "--iters=1", "--cache-dir=/proc")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "exatrain doctor: 2 rank(s) on 1 node(s), backend gloo" in r.stdout
    assert r.stdout.count("cache directory /proc is not writable") == 2  # rank 0 and rank 1
    assert "HINT: point data.cache_dir" in r.stdout and "doctor: 2 check(s) failed" in r.stdout
    for launcher_noise in (
        "Traceback",
        "ChildFailedError",
        "exatrain: error",
        "failed with exit code",
        "--max-restarts",
        "failed (exitcode",
    ):
        assert launcher_noise not in out, out


def test_bad_input_under_nproc_is_an_error_with_a_hint(exatrain_cli):
    r = exatrain_cli("doctor", "--nproc=2", "--max-size=1TB")
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "exatrain: error: size '1TB'" in r.stderr and "HINT: use e.g. --max-size 64KiB" in r.stderr
    assert "Traceback" not in out and "failed with exit code" not in out and "failed (exitcode" not in out
