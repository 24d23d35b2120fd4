"""Config loading: TOML + overrides, rejection of unknown keys and wrong types, docs kept true."""

from pathlib import Path

import pytest

from exatrain.config import Config, load_config, reference, to_toml
from exatrain.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_without_file():
    cfg = load_config()
    assert cfg == Config()
    assert cfg.model.size == "tiny" and cfg.data.kind == "synthetic"


def test_toml_file_then_overrides_win(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('[train]\nsteps = 7\nlr = 1\n[model]\nsize = "small"\n')
    cfg = load_config(str(f), ["--train.steps=9", "--data.kind=wikitext", "--dist.resolve_master=true"])
    assert cfg.train.steps == 9
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)
    assert cfg.model.size == "small" and cfg.data.kind == "wikitext" and cfg.dist.resolve_master is True


def test_round_trip_through_toml(tmp_path):
    cfg = load_config(None, ['--run.dir=a "quoted" dir', "--train.steps=3"])
    f = tmp_path / "c.toml"
    f.write_text(to_toml(cfg))
    assert load_config(str(f)) == cfg


@pytest.mark.parametrize(
    "override, needle",
    [
        ("--train.stepz=5", "valid keys of [train]: steps"),
        ("--trian.steps=5", "valid sections: run, model, data, train, dist"),
    ],
)
def test_unknown_keys_list_valid_ones(override, needle):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert needle in str(e.value) and "HINT:" in str(e.value)


@pytest.mark.parametrize(
    "override",
    [
        "--train.steps=five",
        "--train.steps=1.5",
        "--train.steps=true",
        "--train.eval_at_start=1",
        "--model.size=3",
    ],
)
def test_wrong_types_rejected(override):
    with pytest.raises(ConfigError, match="must be") as e:
        load_config(None, [override])
    assert "HINT:" in str(e.value)


def test_unknown_key_in_file_and_bad_toml(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[train]\nbatch = 3\n")
    with pytest.raises(ConfigError, match="train.batch"):
        load_config(str(f))
    f.write_text("[train\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(str(f))
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "missing.toml"))


def test_malformed_override():
    with pytest.raises(ConfigError, match="--section.key=value"):
        load_config(None, ["--steps=3"])


def test_docs_reference_matches_the_code():
    text = (ROOT / "docs" / "configuration.md").read_text()
    start = text.index("<!-- config-reference:start -->\n") + len("<!-- config-reference:start -->\n")
    end = text.index("<!-- config-reference:end -->")
    assert text[start:end].strip() == reference().strip(), (
        "regenerate with: .venv/bin/python scripts/update_docs.py"
    )


def test_job_section_from_file_and_overrides(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text(
        '[job]\nnodes = 2\ntime = 90\nextra_sbatch = ["--exclusive"]\n[job.env]\nB = "2"\nA = "x y"\n'
    )
    cfg = load_config(
        str(f), ["--job.nodes=4", '--job.command=["python", "train.py"]', "--job.launch=torchrun"]
    )
    job = cfg.job
    assert (job.nodes, job.time, job.launch) == (4, "90", "torchrun")
    assert job.env == (("A", "x y"), ("B", "2")) and job.extra_sbatch == ("--exclusive",)
    assert job.command == ("python", "train.py")
    f2 = tmp_path / "again.toml"
    f2.write_text(to_toml(cfg))
    assert load_config(str(f2)) == cfg
    assert load_config(None, ['--job.env={NCCL_DEBUG="INFO"}']).job.env == (("NCCL_DEBUG", "INFO"),)


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("--job.nodes=two", "job.nodes must be int"),
        ("--job.env={A=1}", "job.env must be a table of strings"),
        ("--job.extra_sbatch=--exclusive", "job.extra_sbatch must be a list of strings"),
        ("--job.time=true", "job.time must be str | int"),
        ("--job.gpus=2", "unknown config key job.gpus"),
    ],
)
def test_job_section_type_errors(override, needle):
    with pytest.raises(ConfigError, match=needle.replace("|", r"\|")) as e:
        load_config(None, [override])
    assert e.value.hint


def test_job_section_maps_to_the_checked_spec():
    from exatrain.slurm import JobSpec

    spec = JobSpec.from_config(load_config(None, ["--job.time=45", "--job.nodes=3"]).job)
    assert spec.slurm_time() == "00:45:00" and spec.nodes == 3
    with pytest.raises(ConfigError, match="not a launch mode"):
        JobSpec.from_config(load_config(None, ["--job.launch=mpirun"]).job)
    for bad in ("runs/a", ""):  # %x puts the name into the output file's path
        with pytest.raises(ConfigError, match="empty or contains '/'") as e:
            JobSpec.from_config(load_config(None, [f"--job.name={bad}"]).job)
        assert "HINT" in str(e.value) or e.value.hint
