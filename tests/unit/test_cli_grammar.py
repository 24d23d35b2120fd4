"""One CLI grammar (issue "House in order"): -c/--config everywhere, the older spellings still accepted with a
note for one release, `sbatch` an alias of `submit --dry-run`, grouped top-level help."""

import json

import pytest

from exatrain.cli.main import COMMAND_GROUPS, build_parser, main

JOB = '[job]\nprofile = "cpu"\nnodes = 1\ntime = "10"\n'


@pytest.fixture
def job(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.toml").write_text(JOB)
    return "job.toml"


def test_config_option_and_the_deprecated_positional_give_the_same_script(job, capsys):
    assert main(["sbatch", "-c", job]) == 0
    new = capsys.readouterr()
    assert "deprecated" not in new.err
    assert main(["sbatch", job]) == 0
    old = capsys.readouterr()
    assert old.out == new.out
    assert f"write: exatrain sbatch -c {job}" in old.err


def test_two_config_files_are_refused_with_a_hint(job, capsys):
    assert main(["cost", "-c", job, job]) == 2
    err = capsys.readouterr().err
    assert "two config files" in err and "HINT: give one: exatrain cost -c FILE" in err


def test_sbatch_is_submit_dry_run(job, capsys):
    assert main(["sbatch", "-c", job]) == 0
    alias = capsys.readouterr()
    assert main(["submit", "--dry-run", "-c", job]) == 0
    dry = capsys.readouterr()
    assert alias.out == dry.out and alias.out.startswith("#!/bin/bash")
    assert "# dry run: would write" in alias.err and "# dry run: would write" in dry.err


def test_old_profile_option_of_run_is_the_site_option(capsys):
    from exatrain.cli.main import _renamed

    assert _renamed(["run", "--profile", "lumi-g", "x.py"]) == ["run", "--site", "lumi-g", "x.py"]
    assert _renamed(["doctor", "--profile=cpu"]) == ["doctor", "--site=cpu"]
    assert "run --profile is now --site" in capsys.readouterr().err
    assert _renamed(["train", "--profile.ranks=0"]) == [
        "train",
        "--profile.ranks=0",
    ]  # a config key, not the option


def test_old_profiler_section_name_is_read_with_a_note(tmp_path, capsys):
    from exatrain.config import load_config

    cfg = load_config(None, ["--profile.ranks=0,last", "--profile.steps=2-3"])
    assert (cfg.profiler.ranks, cfg.profiler.steps) == ("0,last", "2-3")
    assert "[profile]" in capsys.readouterr().err


def test_help_groups_every_command():
    parser = build_parser()
    text = parser.format_help()
    grouped = [c for names in COMMAND_GROUPS.values() for c in names]
    assert len(grouped) == len(set(grouped))
    for group, names in COMMAND_GROUPS.items():
        assert f"{group}:" in text
        assert all(f"  {n} " in text for n in names)


def test_scale_takes_comma_lists_and_repeats():
    parser = build_parser()
    args, _ = parser.parse_known_args(["scale", "--nproc", "1,2", "--nproc", "4"])
    from exatrain.tools.scale import parse_counts

    assert parse_counts(",".join(args.nproc)) == [1, 2, 4]


def test_an_override_with_a_space_is_not_taken_for_the_config_file(job, tmp_path, capsys):
    """argparse reads `--run.dir=my runs/x` as a positional (it has a space): it stays an override."""
    assert main(["submit", "-c", job, "--dry-run", f"--run.dir={tmp_path / 'my runs' / 'x'}"]) == 0
    assert "my runs/x.sbatch" in capsys.readouterr().err


def test_a_command_s_usage_and_errors_name_it_like_git_or_torchrun(capsys):
    """`exatrain plan --help` starts "usage: exatrain plan", and a missing option says "exatrain plan: error",
    not the top-level usage repeated before the command's name."""
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    assert capsys.readouterr().out.startswith("usage: exatrain plan [-h]")
    with pytest.raises(SystemExit) as exit_:
        main(["plan"])
    err = capsys.readouterr().err
    assert (
        exit_.value.code == 2
        and "exatrain plan: error: the following arguments are required: --world-size" in err
    )
    assert "COMMAND ..." not in err


def test_job_commands_take_the_site_as_site(job, capsys):
    """`--site` names the site profile in sbatch, submit and cost too (as --job.profile=SITE; it wins over
    the config file's [job] profile, like any command-line value)."""
    assert main(["sbatch", "-c", job, "--site", "juwels-booster"]) == 0
    script = capsys.readouterr().out
    assert "profile juwels-booster" in script and "#SBATCH --partition=booster" in script
    assert main(["sbatch", "-c", job, "--job.profile=juwels-booster"]) == 0
    assert capsys.readouterr().out == script
    assert main(["cost", "-c", job, "--site", "lumi-g"]) == 0
    assert " on standard-g (rule whole-node" in capsys.readouterr().out
    assert main(["cost", "-c", job]) == 0  # the cpu profile of JOB: no default partition
    assert " on the default partition (rule " in capsys.readouterr().out


def test_an_unknown_option_names_the_command_and_its_help(job, capsys):
    assert main(["sbatch", "-c", job, "--sitee"]) == 2
    err = capsys.readouterr().err
    assert "unrecognised argument(s) of `exatrain sbatch`: --sitee" in err
    assert "HINT: `exatrain sbatch --help` lists its options" in err
    with pytest.raises(SystemExit):
        main(["status", "--job", "12"])
    err = capsys.readouterr().err
    assert (
        err.startswith("usage: exatrain status")
        and "exatrain status: error: unrecognised arguments: --job" in err
    )


def test_a_closed_pipe_stops_quietly():
    """`exatrain config --reference | head -1`: exit code 1, no BrokenPipeError traceback."""
    import subprocess
    import sys

    r = subprocess.run(
        f"{sys.executable} -m exatrain.cli.main config --reference | head -c 10",
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
        executable="/bin/bash",
    )
    assert len(r.stdout) == 10 and "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr


def test_a_config_value_may_follow_its_key_after_a_space(job, capsys):
    """`--model.n_layers 32`, as argparse users write options, means `--model.n_layers=32`: the same plan, and
    the value is not taken for the deprecated positional config file; a key without a value still gets the
    HINT naming both forms."""
    shape = ["--world-size", "8", "--json", "--train.global_batch_size=128"]

    def plan(*words: str) -> dict:
        assert main(["plan", *shape, *words]) == 0
        report = json.loads(capsys.readouterr().out)
        report.pop("elapsed_s")  # the only field that differs between two runs of one plan
        return report

    joined = plan("--model.n_layers=6", "--parallel.tp=2")
    assert plan("--model.n_layers", "6", "--parallel.tp", "2") == joined
    assert plan() != joined  # the values were read, not dropped
    assert main(["sbatch", "--job.nodes", "2", job]) == 0  # the positional file after a spaced value
    out = capsys.readouterr()
    assert "#SBATCH --nodes=2" in out.out and "deprecated" in out.err
    assert main(["plan", "--world-size", "8", "--model.n_layers"]) == 2
    err = capsys.readouterr().err
    assert "unrecognised argument(s) of `exatrain plan`: --model.n_layers" in err
    assert "--section.key=value or --section.key value" in err
