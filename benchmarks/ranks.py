"""Run a benchmark on several real ranks the way users run exatrain: started by a launcher, or by exatrain's
local launcher (torchrun's agent) when the script is called directly."""

from __future__ import annotations

import tempfile

from exatrain.env import detect_environment
from exatrain.launch import launch_local


def run_on_ranks(module: str, argv: list[str], a, data_config, worker) -> int:
    """Call `worker(a, env)` on each rank. Outside a launcher: fill the data cache once for
    `data_config(a)` (unless None) in a temporary run directory (given to the ranks as --run-dir), then
    start `a.nproc` workers of `python -m module argv`."""
    env = detect_environment()
    if env.kind != "local":
        worker(a, env)
        return 0
    if data_config is None:
        return launch_local(a.nproc, module, argv)
    from exatrain.train.entry import prepare_data

    with tempfile.TemporaryDirectory() as tmp:
        a.run_dir = tmp
        prepare_data(data_config(a))  # once, before the ranks start (they would race to fill the cache)
        return launch_local(a.nproc, module, [*argv, f"--run-dir={tmp}"])
