"""torch 2.4.0's ``torch.distributed.run`` (``torchrun``), reproduced for the tests where only torch 2.13 is
installed: what a job on LUMI's or JSC's older torch meets.

Reproduced from torch 2.4.0's own source (torch/distributed/run.py, elastic/multiprocessing/api.py and
elastic/agent/server/api.py in the 2.4.0 wheel on PyPI):

- the command line: the same options (names, underscore spellings, types, defaults, choices, the
  ``PET_*`` environment defaults of torch's own ``env``/``check_env`` actions, which are unchanged in
  2.13), the ``training_script`` positional and the REMAINDER after it, argparse's own errors: an option
  2.4 lacks (``--signals-to-handle``, ``--shutdown-timeout``, ``--numa-binding``, ...) is refused with
  "unrecognized arguments" and exit code 2, as 2.4's torchrun refuses it. Checked against the 2.4.0
  wheel's parser on the command lines of the tests (same namespace or the same error text);
- the signals: the agent handles SIGTERM, SIGINT, SIGHUP and SIGQUIT only (PContext.start in 2.4), stops
  the workers with the signal it got and kills them 30 s later (PContext.close's fixed timeout); any other
  signal, SIGUSR2 included, keeps its default action: it kills the agent, which forwards nothing.

Not reproduced: everything after the command line runs torch 2.13's own launcher (rendezvous, worker
start in their own sessions, log tails, error files, restarts, the OMP_NUM_THREADS banner), with the 2.4
parser's values and the 2.4 signal settings above; 2.4's differences there (e.g. master_port's default of
29500, kept here as 2.4 has it) are not known to matter for exatrain. Import hooks and the package's
metadata are made by overlay.py; ``torch.__version__`` itself stays 2.13.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from torch.distributed.argparse_util import check_env, env
from torch.distributed.elastic.multiprocessing.errors import record

# (spellings, action, type, default, choices) in 2.4's order; action None: argparse's plain store.
_OPTIONS = [
    (("--nnodes",), env, str, "1:1", None),
    (("--nproc-per-node", "--nproc_per_node"), env, str, "1", None),
    (("--rdzv-backend", "--rdzv_backend"), env, str, "static", None),
    (("--rdzv-endpoint", "--rdzv_endpoint"), env, str, "", None),
    (("--rdzv-id", "--rdzv_id"), env, str, "none", None),
    (("--rdzv-conf", "--rdzv_conf"), env, str, "", None),
    (("--standalone",), check_env, None, None, None),
    (("--max-restarts", "--max_restarts"), env, int, 0, None),
    (("--monitor-interval", "--monitor_interval"), env, float, 0.1, None),
    (("--start-method", "--start_method"), env, str, "spawn", ["spawn", "fork", "forkserver"]),
    (("--role",), env, str, "default", None),
    (("-m", "--module"), check_env, None, None, None),
    (("--no-python", "--no_python"), check_env, None, None, None),
    (("--run-path", "--run_path"), check_env, None, None, None),
    (("--log-dir", "--log_dir"), env, str, None, None),
    (("-r", "--redirects"), env, str, "0", None),
    (("-t", "--tee"), env, str, "0", None),
    (("--local-ranks-filter", "--local_ranks_filter"), env, str, "", None),
    (("--node-rank", "--node_rank"), env, int, 0, None),
    (("--master-addr", "--master_addr"), env, str, "127.0.0.1", None),
    (("--master-port", "--master_port"), env, int, 29500, None),
    (("--local-addr", "--local_addr"), env, str, None, None),
    (("--logs-specs", "--logs_specs"), None, str, None, None),
]
SIGNALS_24 = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"  # the agent's handlers in 2.4 (PContext.start)
CLOSE_TIMEOUT_24 = 30  # seconds from the death signal to SIGKILL (PContext.close in 2.4)


def get_args_parser() -> argparse.ArgumentParser:
    """torch 2.4's torchrun parser (help texts left out)."""
    parser = argparse.ArgumentParser(description="Torch Distributed Elastic Training Launcher")
    for names, action, kind, default, choices in _OPTIONS:
        kwargs = {"action": action} if action else {}
        if action is not check_env:
            kwargs.update(type=kind, default=default)
        if choices:
            kwargs["choices"] = choices
        parser.add_argument(*names, **kwargs)
    parser.add_argument("training_script", type=str)
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return parser


def parse_args(args):
    """As 2.4's: the parser above, argparse's errors (exit code 2) included."""
    return get_args_parser().parse_args(args)


def _torch_run():
    """torch 2.13's own torch/distributed/run.py, loaded under another name (this module holds its name)."""
    import torch.distributed

    path = Path(torch.distributed.__file__).parent / "run.py"
    spec = importlib.util.spec_from_file_location("torch.distributed._run_installed", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(args) -> None:
    """Launch as 2.4 does: the installed torch's launcher with 2.4's values and 2.4's signal settings."""
    installed = _torch_run()
    values = vars(installed.get_args_parser().parse_args([args.training_script]))
    values.update(vars(args), signals_to_handle=SIGNALS_24, shutdown_timeout=CLOSE_TIMEOUT_24)
    installed.run(argparse.Namespace(**values))


@record
def main(args=None):
    """``torchrun``'s entry point (the console script calls ``sys.exit(main())``)."""
    run(parse_args(args))
