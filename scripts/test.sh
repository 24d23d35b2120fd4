#!/usr/bin/env bash
# Install everything the tests need (Debian packages for the real SLURM cluster, headless Chromium for the
# report page, Open MPI for tests/e2e/test_mpi.py and MPICH for tests/e2e/test_mpich.py included; needs root)
# and run the whole test suite.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PKGS="munge slurmctld slurmd slurm-client chromium openmpi-bin mpich bubblewrap iproute2 nftables slurmdbd mariadb-server"  # bwrap: the container twin; ip/nft: the SLURM site twins; slurmdbd + MariaDB: the testbed's accounting
missing=$(for p in $PKGS; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"; done)
if [ -n "$missing" ]; then
  echo "test: installing Debian packages:" $missing
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  # mpirun/mpiexec are Debian alternatives: Open MPI's (priority 50) stays the default over MPICH's (40);
  # pinned anyway, since the tests call Open MPI as mpirun and MPICH only as mpiexec.mpich
  update-alternatives --quiet --set mpirun /usr/bin/mpirun.openmpi
fi
# horovod: built once per machine (~8 min on 2 cores), then installed from the cached wheel
bash scripts/install.sh test,examples,deepspeed,horovod
# Two pytest-xdist workers: a test's ranks leave cores idle while they start, join or write, and the other
# worker's test uses them (tests/conftest.py keeps each file, and all SLURM tests, in one worker; `-n 0` runs
# everything in this process). The 30 slowest tests are listed at the end, so CI time (budget: 40 min) can be
# watched.
# Lint and format first (seconds): ruff with the settings of pyproject.toml. Two commands, not one `a && b`
# list: set -e ignores a failure of any but the last command of such a list, so a lint error went unnoticed.
.venv/bin/ruff check --no-cache .
.venv/bin/ruff format --no-cache --check .
exec .venv/bin/python -m pytest -n 2 --durations=30 "$@"
