"""The `exatrain` command as users call it: env, config, data prepare, help."""

import functools
import http.server
import io
import json
import subprocess
import sys
import threading
import zipfile

import pytest

from tests.ports import free_port


def test_env_json_under_real_torchrun(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            "--tee=1",
            "--log-dir",
            str(tmp_path / "logs"),
            "-m",
            "exatrain.cli.main",
            "env",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    docs = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("logs/**/stdout.log"))]
    assert sorted(d["global_rank"] for d in docs) == [0, 1]
    assert all(d["kind"] == "torchelastic" and d["world_size"] == 2 and d["device"] == "cpu" for d in docs)


def test_env_table_and_batch_shell_note(exatrain_cli):
    batch_shell = {
        "SLURM_JOB_ID": "42",
        "SLURM_NTASKS": "4",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_JOB_NODELIST": "nid[005000-005001]",
        "SLURM_TASKS_PER_NODE": "2(x2)",
    }
    r = exatrain_cli("env", env=batch_shell)
    assert r.returncode == 0, r.stderr
    assert "local" in r.stdout and "batch" in r.stdout and "srun" in r.stdout


def test_config_prints_resolved_toml(exatrain_cli):
    r = exatrain_cli("config", "--train.steps=7")
    assert r.returncode == 0 and "steps = 7" in r.stdout


def _zip_with_splits() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for split in ("train", "valid", "test"):
            z.writestr(f"wikitext-2/wiki.{split}.tokens", f" = Title = \n the {split} words here \n")
    return buf.getvalue()


@pytest.fixture
def local_server(tmp_path):
    """An HTTP server on 127.0.0.1 serving tmp_path/www (stands in for the dataset mirror)."""
    www = tmp_path / "www"
    www.mkdir()
    (www / "wikitext-2-v1.zip").write_bytes(_zip_with_splits())
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(www))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_data_prepare_downloads_and_extracts(exatrain_cli, local_server, tmp_path):
    out = tmp_path / "wt2"
    r = exatrain_cli(
        "data", "prepare", "wikitext-2", "--out", str(out), "--url", f"{local_server}/wikitext-2-v1.zip"
    )
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "wiki.test.tokens",
        "wiki.train.tokens",
        "wiki.valid.tokens",
    ]
    assert f"--data.path={out}" in r.stdout


def test_data_prepare_offline_fails_clearly(exatrain_cli, tmp_path):
    port = free_port()  # a port nobody listens on: connection refused, as on an offline node
    out = tmp_path / "wt2"
    r = exatrain_cli(
        "data",
        "prepare",
        "wikitext-2",
        "--out",
        str(out),
        "--url",
        f"http://127.0.0.1:{port}/x.zip",
        timeout=60,
    )
    assert r.returncode == 2
    assert f"127.0.0.1:{port}" in r.stderr and "HINT:" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists() or not any(out.iterdir())


def test_help_is_fast_and_lists_commands(exatrain_cli):
    r = exatrain_cli("--help")
    assert r.returncode == 0
    for cmd in ("train", "env", "config", "data"):
        assert cmd in r.stdout
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "exatrain.cli.main", "--help"],
        capture_output=True,
        text=True,
    )
    assert "torch" not in {line.split("|")[-1].strip().split(".")[0] for line in r.stderr.splitlines()[1:]}


WIKITEXT = __import__("tests.conftest", fromlist=["ROOT"]).ROOT.parent / "shared" / "data" / "wikitext-2"


@pytest.mark.skipif(
    not (WIKITEXT / "valid.txt").exists(), reason="real WikiText-2 splits not present beside the checkout"
)
def test_train_on_real_wikitext_valid_split(exatrain_cli, tmp_path):
    """Optional: the real WikiText-2 valid/test files (no train split there: train on valid, eval on test)."""
    r = exatrain_cli(
        "train",
        "--nproc=1",
        "--data.kind=wikitext",
        f"--data.path={WIKITEXT}",
        "--data.train_split=valid",
        "--data.eval_split=test",
        "--train.steps=4",
        "--train.log_every=1",
        "--train.eval_batches=2",
        f"--run.dir={tmp_path / 'run'}",
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["final_eval"]["loss"] < summary["initial_eval"]["loss"]
