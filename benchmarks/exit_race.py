"""How often a finished 4-rank DDP script aborts at exit, started by plain torchrun or through exatrain's \
script
runner (see exatrain/launch/script_runner.py and pytorch/pytorch#190489). The two sides alternate run by run.

The script is the tutorial shape at module level: a DDP model, a few steps, an all-reduced loss, then
`destroy_process_group()`. A run counts as aborted when its workers printed "terminate called" or torchrun
failed. Not a timing benchmark: the counts depend on how loaded the machine is (a busier machine schedules
gloo's threads later and aborts more often), so compare the two sides of one run only.

With --held the DDP model is also kept from another module's global (here `builtins`) until exit, so freeing
the script's garbage cannot release its process group: only never finalizing the interpreter avoids the race.

    .venv/bin/python benchmarks/exit_race.py --runs 30
    .venv/bin/python benchmarks/exit_race.py --runs 30 --held
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

SCRIPT = """import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
model = DDP(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    total = torch.zeros(2)
    for _ in range(4):
        opt.zero_grad(); loss = model(torch.randn(4, 8)).pow(2).mean(); loss.backward(); opt.step()
        total += torch.stack([loss.detach(), torch.tensor(1.0)])
    dist.all_reduce(total)
    mean = total[0].item() / total[1].item()
dist.destroy_process_group()
"""
HELD = "import builtins\nbuiltins.kept_model = model  # as a module global elsewhere would keep it\n"
SIDES = {"plain torchrun": [], "script runner": ["-m", "exatrain.launch.script_runner"]}


def aborted(side: list[str], script: str, port: int) -> bool:
    """One torchrun of 4 workers; True when it aborted or failed."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=4",
        f"--master-port={port}",
        *side,
        script,
    ]
    r = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    return r.returncode != 0 or "terminate called" in r.stdout + r.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="runs per side")
    parser.add_argument("--held", action="store_true", help="keep the DDP model referenced until exit")
    args = parser.parse_args()
    counts = dict.fromkeys(SIDES, 0)
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "ddp_exit.py")
        with open(script, "w") as f:
            f.write(
                SCRIPT.replace("dist.destroy_process_group()", HELD + "dist.destroy_process_group()")
                if args.held
                else SCRIPT
            )
        for i in range(args.runs):
            for j, (name, side) in enumerate(SIDES.items()):
                counts[name] += aborted(side, script, 31000 + 2 * i + j)
            print(
                f"after {i + 1} runs per side: " + ", ".join(f"{k} {v} aborted" for k, v in counts.items()),
                flush=True,
            )
    for name, n in counts.items():
        print(f"{name}: {n} of {args.runs} runs aborted at exit")


if __name__ == "__main__":
    main()
