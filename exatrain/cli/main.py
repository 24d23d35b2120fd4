"""The one `exatrain` command. Thin: parses arguments and calls the API; heavy imports stay lazy."""

from __future__ import annotations

import argparse
import os
import sys

from exatrain import __version__
from exatrain.errors import ExatrainError


def build_parser() -> argparse.ArgumentParser:
    """All subcommands and their flags (config keys are passed as --section.key=value overrides)."""
    p = argparse.ArgumentParser(
        prog="exatrain",
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="exatrain [-h] [--version] COMMAND ...",
        description="PyTorch training from one CPU to thousands of GPUs on SLURM clusters.",
    )
    p.add_argument("--version", action="version", version=f"exatrain {__version__}")
    sub = p.add_subparsers(
        prog="exatrain", dest="command", required=True, metavar="COMMAND", help=argparse.SUPPRESS
    )

    t = sub.add_parser(
        "train",
        allow_abbrev=False,
        help="train the reference LM (here, under torchrun, srun or mpirun)",
        epilog="Any --section.key=value (or --section.key value) sets a config value, "
        "e.g. --train.steps=100 --model.size=small.",
    )
    t.add_argument("-c", "--config", help="TOML configuration file")
    t.add_argument(
        "--nproc",
        type=int,
        default=None,
        help="local worker processes when started outside a launcher (default: GPUs on this node, else 2)",
    )
    t.add_argument(
        "--affinity",
        choices=["warn", "strict", "off"],
        help="shorthand for --dist.affinity: check each rank's CPU affinity against the cores expected "
        "for it; strict fails the job on a mismatch",
    )
    t.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="with --nproc: let torchrun's elastic agent restart the workers this often after a failure "
        "(they resume from the latest checkpoint)",
    )

    p.run_parser = _add_run_command(sub)

    e = sub.add_parser(
        "env", allow_abbrev=False, help="show the detected cluster environment of this process"
    )
    e.add_argument("--json", action="store_true", help="print JSON instead of a table")
    e.add_argument("-c", "--config", help="TOML configuration file (its [dist] section applies)")

    c = sub.add_parser(
        "config", allow_abbrev=False, help="print the resolved configuration, or the reference"
    )
    c.add_argument("-c", "--config", help="TOML configuration file")
    c.add_argument(
        "--reference", action="store_true", help="print every key with its type, default and meaning"
    )

    d = sub.add_parser("data", allow_abbrev=False, help="prepare datasets")
    dsub = d.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    pr = dsub.add_parser(
        "prepare",
        allow_abbrev=False,
        help="download a dataset (run on a machine with internet, e.g. a login node)",
    )
    pr.add_argument("dataset", choices=["wikitext-2"])
    pr.add_argument(
        "--out", required=True, help="directory to write the dataset to (then set data.path to it)"
    )
    pr.add_argument("--url", help="download from this URL instead of the default mirrors")
    pr.add_argument("--timeout", type=float, default=30.0, help="seconds per connection attempt")
    pl = sub.add_parser(
        "plan",
        allow_abbrev=False,
        help="check a parallel layout for N ranks in one process: memory per GPU, with --time the step time, "
        "--search the fastest layouts, --target-tokens wall time and cost",
        epilog="Any --section.key=value (or --section.key value) sets a config value, "
        "e.g. --parallel.tp=8 --model.size=xl.",
    )
    pl.add_argument("-c", "--config", help="TOML configuration file")
    pl.add_argument("--world-size", type=int, required=True, help="ranks (GPUs) of the job, up to 16384")
    pl.add_argument(
        "--gpu-memory-gb",
        type=float,
        help="memory of one GPU in GiB for the verdict (default: the --site profile's gpu_memory_gb)",
    )
    pl.add_argument(
        "--site",
        help="site profile (name or .toml path) whose gpu_memory_gb, gpus_per_node and "
        "[hardware] constants to use",
    )
    pl.add_argument(
        "--time",
        action="store_true",
        help="predict the step time from the --site profile's [hardware] table (docs/planning.md)",
    )
    pl.add_argument(
        "--target-tokens",
        type=float,
        help="also predict wall time and billing units to train on this many tokens, e.g. 300e9 "
        "(implies --time; with --search, for every listed layout)",
    )
    pl.add_argument(
        "--search",
        action="store_true",
        help="rank every valid layout for --world-size by predicted step time (needs --site with [hardware])",
    )
    pl.add_argument(
        "--top", type=int, default=10, help="with --search: how many layouts to print (default 10)"
    )
    pl.add_argument("--vocab-size", type=int, help="vocabulary size (default: the configured data's)")
    pl.add_argument("--json", action="store_true", help="print JSON instead of a table")

    k = sub.add_parser("checkpoint", allow_abbrev=False, help="work with checkpoints")
    ksub = k.add_subparsers(dest="checkpoint_command", required=True, metavar="ACTION")
    ex = ksub.add_parser(
        "export",
        allow_abbrev=False,
        help="write a checkpoint's model as one plain state dict file (loads with weights_only=True)",
    )
    ex.add_argument("checkpoint", help="a RUN_DIR/checkpoints/step-N folder")
    ex.add_argument("output", help="file to write, e.g. model.pt")
    _add_job_commands(sub)
    p.epilog = _grouped_commands(sub)
    p.commands = sub.choices  # command name -> its parser (for errors in the command's own words)
    return p


#: `exatrain --help` lists the commands in these groups, as git and kubectl do
COMMAND_GROUPS = {
    "train and run": ["train", "run"],
    "jobs on a SLURM cluster": ["submit", "sbatch", "cost", "status", "cancel", "monitor", "container"],
    "inspect and plan": ["env", "config", "plan", "doctor", "scale", "report", "dump"],
    "data and checkpoints": ["data", "checkpoint"],
}


def _grouped_commands(sub) -> str:
    """The commands with their one-line help, grouped (COMMAND_GROUPS), for the top-level --help."""
    helps = {a.dest: a.help for a in sub._choices_actions}
    missing = sorted(set(helps) - {c for names in COMMAND_GROUPS.values() for c in names})
    assert not missing, f"commands missing from COMMAND_GROUPS: {missing}"
    width = max(map(len, helps)) + 2
    lines = []
    for group, names in COMMAND_GROUPS.items():
        lines += [f"{group}:", *(f"  {n:<{width}}{helps[n]}" for n in names), ""]
    return "\n".join(lines) + "Run `exatrain COMMAND --help` for a command's options."


RUN_USAGE = "exatrain run [OPTIONS] [--] SCRIPT.py [ARGS...]  |  exatrain run [OPTIONS] -m MODULE [ARGS...]"


def _add_run_command(sub) -> argparse.ArgumentParser:
    """`run`: an unmodified torch.distributed script, as local workers or as this launcher's rank."""
    r = sub.add_parser(
        "run",
        allow_abbrev=False,
        usage=RUN_USAGE,
        help="run your own torch.distributed script (here, or as a rank under srun, mpirun, torchrun)",
        description="Outside a launcher: N local workers under torchrun's elastic agent. Under srun, "
        "mpirun or torchrun: set RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, "
        "MASTER_ADDR and MASTER_PORT for this rank and replace this process with the script. "
        "Everything after the script (or -m MODULE) is the script's own arguments.",
    )
    value_options = [
        r.add_argument(
            "--nproc",
            type=int,
            default=None,
            help="local workers when started outside a launcher (default: GPUs on this node, else 2)",
        ),
        r.add_argument(
            "--max-restarts",
            type=int,
            default=0,
            help="with --nproc: let torchrun's elastic agent restart the workers this often after a failure",
        ),
        r.add_argument(
            "--site",
            help="site profile (name or .toml path): its CPU masks for the affinity check "
            "and its master suffix",
        ),
        r.add_argument(
            "--master-suffix",
            help="appended to the derived master host name (JSC: i); default: the profile's",
        ),
        r.add_argument(
            "--master-port",
            type=int,
            help="rendezvous port (default: MASTER_PORT or one derived from the SLURM job and step id)",
        ),
        r.add_argument(
            "--affinity",
            choices=["warn", "strict", "off"],
            default="warn",
            help="check this rank's CPU affinity against the cores expected for it (strict: fail)",
        ),
        r.add_argument(
            "--hang-timeout",
            type=_hang_timeout,
            default=None,
            metavar="SECONDS|auto",
            help="declare a rank hung after this long without progress (exatrain.DataLoader batches, "
            "Checkpointer calls, exatrain.step()): dump every rank's stacks and a diagnosis to "
            "RUN_DIR/hang/ and stop with exit code 76; auto: max(10 x the median step, 300 s, the "
            "first step). Absent: no watcher, but the stacks are still dumped at a collective timeout "
            "and by `exatrain dump`; 0: not that either (docs/hangs.md)",
        ),
        r.add_argument(
            "--run-dir",
            default="runs/default",
            help="where the ranks' pids and stacks go, in hang/ (default runs/default)",
        ),
    ]
    r.add_argument(
        "--resolve-master", action="store_true", help="resolve the master host name to an IP address"
    )
    r.add_argument(
        "--label",
        action="store_true",
        help="begin each line the script writes with [rank N] (every "
        "rank's lines are written whole, with or without it)",
    )
    # old spellings of value options (RENAMED_OPTIONS) take a value too
    r.value_options = {s for action in value_options for s in action.option_strings} | set(
        RENAMED_OPTIONS["run"]
    )
    return r


def _hang_timeout(value: str) -> float | str:
    """--hang-timeout's value: seconds, or "auto" (derived from the first steps' times)."""
    if value.strip().lower() == "auto":
        return "auto"
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is neither seconds nor auto") from None


def split_run_argv(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], list[str] | None]:
    """``run`` arguments -> (exatrain's own, the target): the target starts at ``--``, at ``-m`` or at the
    first word that is not an option of ``run`` (or its value); None when there is none."""
    takes_value = parser.run_parser.value_options
    i = 1
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return argv[:i], argv[i + 1 :]
        if word == "-m" or not word.startswith("-"):
            return argv[:i], argv[i:]
        i += 2 if word in takes_value else 1
    return argv, None


def _add_job_commands(sub) -> None:
    """sbatch, cost, submit, status, cancel: SLURM jobs from the [job] section (torch-free paths)."""
    job_help = "TOML configuration file with a [job] section (any --section.key=value overrides it)"
    s = sub.add_parser(
        "sbatch",
        allow_abbrev=False,
        help="alias of `submit --dry-run`: print the job script and the sbatch command (writes nothing)",
    )
    c = sub.add_parser(
        "cost", allow_abbrev=False, help="estimate what a job costs under its site's billing rules"
    )
    m = sub.add_parser(
        "submit",
        allow_abbrev=False,
        help="write the job script next to the run directory and submit it with sbatch",
    )
    for parser in (s, c, m):
        _config_options(parser, job_help)
        parser.add_argument(
            "--site", help="site profile (name or .toml path); the same as --job.profile=SITE"
        )
    for parser in (s, m):
        parser.add_argument(
            "--array",
            action="append",
            metavar="KEY=V1,V2,...",
            help="sweep as a job array: task i trains with the i-th value (in RUN_DIR/array-i); "
            "repeat to sweep several keys together",
        )
    mode = m.add_mutually_exclusive_group()
    mode.add_argument(
        "--dry-run", action="store_true", help="print the script and the sbatch command; submit nothing"
    )
    mode.add_argument(
        "--test-only",
        action="store_true",
        help="ask SLURM (sbatch --test-only) whether and when it would start the job; queue nothing",
    )
    _add_container_command(sub)
    st = sub.add_parser("status", allow_abbrev=False, help="show a job's state (default: all your jobs)")
    st.add_argument("job_id", nargs="?", help="job id printed by submit")
    ca = sub.add_parser("cancel", allow_abbrev=False, help="cancel a job (scancel)")
    ca.add_argument("job_id", help="job id printed by submit (array task: ID_INDEX)")
    do = sub.add_parser(
        "doctor",
        allow_abbrev=False,
        help="check GPUs, affinity, fabric, network plugin, caches and all-reduce bandwidth of this "
        "allocation (srun exatrain doctor, or --nproc N here); exit 1 when a check fails",
    )
    do.add_argument(
        "--nproc", type=int, default=None, help="local worker processes when started outside a launcher"
    )
    do.add_argument(
        "--max-size", default="256MiB", help="largest all_reduce message of the sweep (from 1 KiB)"
    )
    do.add_argument("--iters", type=int, default=5, help="timed all_reduce calls per size")
    do.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    do.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for every rank to join")
    do.add_argument(
        "--site",
        default="generic-nvidia",
        help="site profile (name or .toml path) for the CPU affinity masks",
    )
    do.add_argument("--cache-dir", default="", help="a node-local cache directory that must be writable")
    do.add_argument(
        "-c",
        "--config",
        help="the job's TOML configuration file: its [dist] timeout_s and [run] hang_timeout_s are "
        "reported and checked, and the [hardware] rates are timed on its model's products and attention "
        "shape (any --section.key=value overrides it; the two flags below win)",
    )
    do.add_argument(
        "--hang-timeout",
        type=_hang_timeout,
        default=None,
        metavar="SECONDS|auto",
        help="the job's hang timeout, to report and check against its time limit (0: none; default: "
        "[run] hang_timeout_s of the config, else auto, the trainer's default)",
    )
    do.add_argument(
        "--collective-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the job's collective timeout (gloo/NCCL raise after it), to report and check (default: "
        "[dist] timeout_s of the config, else 300)",
    )
    do.add_argument(
        "--nccl-log",
        default="",
        help="an NCCL_DEBUG=INFO log of another job to tell NET/Socket from IB/OFI (the doctor's own "
        "NCCL ranks log theirs anyway)",
    )
    do.add_argument(
        "--nccl-log-dir",
        default="",
        help="keep each GPU rank's NCCL_DEBUG=INFO log here as nccl-rankN.log (default: a temporary "
        "folder, removed)",
    )
    do.add_argument("--verdict-dir", default="", help=argparse.SUPPRESS)  # set by --nproc for its workers
    sc = sub.add_parser(
        "scale",
        allow_abbrev=False,
        help="scaling study here: train at several local world sizes, then write the report",
        epilog="Any --section.key=value (or --section.key value) sets a config value for every run, "
        "e.g. --train.steps=50.",
    )
    _config_options(sc, "TOML configuration file (with a [job] section for --nodes)")
    sizes = sc.add_mutually_exclusive_group(required=True)
    sizes.add_argument("--nproc", action="append", help="local world sizes: 1,2,4 or --nproc 1 --nproc 2 ...")
    sizes.add_argument(
        "--nodes",
        action="append",
        help="node counts of a series of SLURM jobs (one after the other): 1,2,4,8 or repeated",
    )
    sc.add_argument(
        "--mode",
        choices=["strong", "weak"],
        default="strong",
        help="strong: same global batch at every size; weak: same batch per rank",
    )
    sc.add_argument("--out", default="runs/scale", help="folder of the study (one run directory per size)")
    rp = sub.add_parser(
        "report",
        allow_abbrev=False,
        help="one self-contained HTML page (and Markdown tables) of a scaling study's runs",
    )
    rp.add_argument("runs", nargs="+", help="run directories, or the folder of `exatrain scale`")
    rp.add_argument(
        "--out", default="report.html", help="HTML file to write (the Markdown goes next to it, .md)"
    )
    du = sub.add_parser(
        "dump",
        allow_abbrev=False,
        help="every rank's Python stacks of a running `exatrain run` job (its run directory on this "
        "host, or a SLURM job id), and which rank the others wait for (docs/hangs.md)",
    )
    du.add_argument(
        "run_dir",
        metavar="RUN_DIR|JOBID",
        help="the job's --run-dir (its hang/ folder records the ranks' pids), or the id of a running SLURM "
        "job `exatrain submit` started (every node of it is asked, with srun --overlap)",
    )
    du.add_argument(
        "--this-node",
        action="store_true",
        help="only make the ranks on this node dump their stacks (what each node runs for a job id)",
    )
    mo = sub.add_parser(
        "monitor",
        allow_abbrev=False,
        help="live table of every GPU of a running job (srun --overlap --jobid; Ctrl-C stops)",
    )
    mo.add_argument("job_id", help="id of a RUNNING job")
    mo.add_argument("--interval", type=float, default=5.0, help="seconds between readings (default 5)")
    mo.add_argument("--once", action="store_true", help="print one table and exit")


def _config_options(parser: argparse.ArgumentParser, help_text: str) -> None:
    """-c/--config FILE, and the older positional FILE (still accepted, with a note)."""
    parser.add_argument("-c", "--config", help=help_text)
    parser.add_argument("config_file", nargs="?", metavar="FILE", help="deprecated: use -c/--config FILE")


#: command -> {old option: new option}; the old spelling still works for one release, with a note
RENAMED_OPTIONS = {"run": {"--profile": "--site"}, "doctor": {"--profile": "--site"}}


def _renamed(argv: list[str]) -> list[str]:
    """Rewrite the renamed options of `argv`'s command to their new names, printing a note for each."""
    renames = RENAMED_OPTIONS.get(argv[0] if argv else "", {})
    out = []
    for word in argv:
        name, eq, value = word.partition("=")
        if name in renames:
            print(
                f"exatrain: note: {argv[0]} {name} is now {renames[name]}; the old name is "
                "accepted until the "
                "next release",
                file=sys.stderr,
            )
            word = renames[name] + eq + value
        out.append(word)
    return out


OVERRIDE_COMMANDS = ("train", "env", "config", "plan", "sbatch", "cost", "submit", "scale", "doctor")


def _joined_overrides(argv: list[str]) -> list[str]:
    """`--section.key value` as `--section.key=value`, the two forms argparse users write: joined before
    argparse reads the words, so that the value is not taken for the deprecated positional config file."""
    if not argv or argv[0] not in OVERRIDE_COMMANDS:
        return argv
    out: list[str] = []
    words = iter(argv)
    for word in words:
        name = word[2:]
        if word.startswith("--") and "=" not in word and "." in name and not name.startswith("."):
            value = next(words, None)
            if value is None or value.startswith("--"):
                out.append(word)  # no value: left for _overrides to refuse with its HINT
                if value is not None:
                    out.append(value)
                continue
            word = f"{word}={value}"
        out.append(word)
    return out


def _override_taken_for_a_file(args, extra: list[str]) -> list[str]:
    """argparse reads an argument with a space as a positional even when it starts with ``--``
    (``--run.dir=my runs/x``): such a word is an override, not the deprecated positional config file."""
    word = getattr(args, "config_file", None)
    if word is not None and word.startswith("--"):
        args.config_file = None
        return [word, *extra]
    return extra


def _resolve_config(args) -> None:
    """The config file of a command that takes it as -c/--config or (deprecated) as its first word."""
    positional = getattr(args, "config_file", None)
    if positional is None:
        return
    if args.config:
        raise ExatrainError(
            f"two config files given: {positional} and -c {args.config}",
            f"give one: exatrain {args.command} -c FILE",
        )
    print(
        f"exatrain: note: the config file as the first word of `exatrain {args.command}` is deprecated; "
        f"write: exatrain {args.command} -c {positional}",
        file=sys.stderr,
    )
    args.config = positional


def _add_container_command(sub) -> None:
    """`container venv IMAGE VENV`: the job's Python environment over a site image
    (docs/sites/containers.md)."""
    co = sub.add_parser(
        "container", allow_abbrev=False, help="prepare a container image's environment for jobs"
    )
    csub = co.add_subparsers(dest="container_command", required=True, metavar="ACTION")
    v = csub.add_parser(
        "venv",
        allow_abbrev=False,
        help="create a venv through the image (--system-site-packages, on a bound path) with "
        "exatrain and PACKAGES in it; then set job.container_venv to its path",
    )
    v.add_argument("image", help="Singularity/Apptainer image (.sif)")
    v.add_argument("venv", help="where to create the venv (a path the jobs bind: LUMI /project or /scratch)")
    v.add_argument("packages", nargs="*", help="further pip requirements to install into it")
    v.add_argument("--runtime", default="singularity", choices=["singularity", "apptainer"])
    v.add_argument(
        "--start",
        default="exec",
        choices=["exec", "run"],
        help="how the image is started (LUMI AI Factory images: run); as job.container_start",
    )
    v.add_argument(
        "--bind",
        action="append",
        default=[],
        metavar="SRC[:DST]",
        help="further bind paths (the venv's folder is bound anyway)",
    )


def _overrides(command: str, extra: list[str]) -> list[str]:
    """The --section.key=value words of a command that takes config values; anything else is refused,
    naming the command's own options when the word looks like one of them."""
    bad = [a for a in extra if not (a.startswith("--") and "=" in a)]
    if bad:
        options = [a for a in bad if a.startswith("-") and "." not in a.split("=")[0]]
        raise ExatrainError(
            f"unrecognised argument(s) of `exatrain {command}`: {' '.join(bad)}",
            (f"`exatrain {command} --help` lists its options; " if options else "")
            + "config values are written --section.key=value or --section.key value, e.g. --train.steps=100",
        )
    return extra


def main(argv: list[str] | None = None) -> int:
    """Run the command line; user errors print a message with a HINT and exit 2, without a traceback."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    target = None
    if argv[:1] == ["run"]:
        argv, target = split_run_argv(parser, argv)
    args, extra = parser.parse_known_args(_joined_overrides(_renamed(argv)))
    args.target = target
    try:
        extra = _override_taken_for_a_file(args, extra)
        _resolve_config(args)
        if args.command in OVERRIDE_COMMANDS:
            extra = _overrides(args.command, extra)
        elif extra:  # the command's own usage and name, as argparse gives them for its other errors
            parser.commands[args.command].error(f"unrecognised arguments: {' '.join(extra)}")
        if args.command in ("sbatch", "cost", "submit") and args.site:
            extra = [*extra, f"--job.profile={args.site}"]
        from exatrain.cli import commands

        return getattr(commands, f"cmd_{args.command}")(args, extra) or 0
    except ExatrainError as e:
        print(f"exatrain: error: {e}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("exatrain: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `exatrain cost | head -1`: the reader left; stop quietly, as cat or grep do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 1


if __name__ == "__main__":
    sys.exit(main())
