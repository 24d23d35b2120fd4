#!/usr/bin/env bash
# Install exatrain (editable) into ./.venv, creating it if needed.
#   bash scripts/install.sh          # the package
#   bash scripts/install.sh test     # plus what the tests need (Python side)
#   bash scripts/install.sh deepspeed  # plus DeepSpeed (extras combine: test,deepspeed,horovod)
#   bash scripts/install.sh horovod    # plus Horovod 0.28.1 built for this torch (scripts/build_horovod.sh:
#                                      # ~8 min on 2 cores the first time, then a cached wheel)
# torch: if the venv cannot import torch yet, installs $TORCH_SPEC (default torch==2.13.0, the CPU wheel
# cached on the project's machines). On a cluster, build the venv on top of your site's torch instead
# (python3 -m venv --system-site-packages .venv) and this script keeps it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
EXTRA=${1:-}
HOROVOD=0
if [[ ",$EXTRA," == *",horovod,"* ]]; then  # not a pip extra: built from source by build_horovod.sh
  HOROVOD=1
  EXTRA=$(echo ",$EXTRA," | sed 's/,horovod,/,/; s/^,//; s/,$//')
fi
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

if [ ! -x .venv/bin/pip ]; then
  rm -rf .venv
  if ! "$PY" -m venv .venv >/dev/null 2>&1; then
    # Debian's python3 has no venv/ensurepip until python3-venv is installed.
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "install: installing python3-venv (Debian)"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      rm -rf .venv && "$PY" -m venv .venv
    else
      echo "install: '$PY -m venv' failed. HINT: install python3-venv (Debian/Ubuntu) or set PYTHON=/path/to/python3" >&2
      exit 1
    fi
  fi
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  echo "install: $TORCH_SPEC"
  .venv/bin/pip install -q --disable-pip-version-check "$TORCH_SPEC"
fi
echo "install: exatrain${EXTRA:+[$EXTRA]}"
.venv/bin/pip install -q --disable-pip-version-check -e ".${EXTRA:+[$EXTRA]}"
if [ "$HOROVOD" = 1 ]; then bash scripts/build_horovod.sh; fi
echo "install: done ($(.venv/bin/exatrain --version), torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'))"
