#!/usr/bin/env bash
# Install exatrain (editable) into ./.venv, creating it if needed.
#   bash scripts/install.sh          # the package
#   bash scripts/install.sh test     # plus what the tests need (Python side)
#   bash scripts/install.sh test,examples   # plus the examples' packages (torchvision, transformers)
#   bash scripts/install.sh deepspeed  # plus DeepSpeed (extras combine: test,deepspeed,horovod)
#   bash scripts/install.sh amd        # plus AMD's amdsmi bindings for the GPU monitor (needs ROCm's libamd_smi.so)
#   bash scripts/install.sh horovod    # plus Horovod 0.28.1 built for this torch (scripts/build_horovod.sh:
#                                      # ~8 min on 2 cores the first time, then a cached wheel)
# torch: if the venv cannot import torch yet, installs $TORCH_SPEC (default torch==2.13.0, the CPU wheel
# cached on the project's machines). On a cluster, build the venv on top of your site's torch instead
# (python3 -m venv --system-site-packages .venv) and this script keeps it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
EXTRA=${1:-}
# Nothing to do when this venv already has exatrain (editable) with these extras, installed by this very
# pyproject.toml and these scripts: a second run returns at once instead of reinstalling exatrain (which would
# briefly leave it unimportable for anything running from this venv at that moment, e.g. other tests).
STAMP=.venv/.exatrain-installed
KEY=$(cat pyproject.toml scripts/install.sh scripts/build_horovod.sh | sha256sum | cut -c1-16)
HAVE=$( [ -x .venv/bin/exatrain ] && [ "$(sed -n 1p "$STAMP" 2>/dev/null)" = "$KEY" ] && sed -n 2p "$STAMP" || echo "-")
if [ "$HAVE" != "-" ]; then
  missing=$(for e in ${EXTRA//,/ }; do [[ ",$HAVE," == *",$e,"* ]] || echo "$e"; done)
  if [ -z "$missing" ]; then
    echo "install: exatrain${EXTRA:+[$EXTRA]} is already installed in .venv (remove $STAMP to reinstall)"
    exit 0
  fi
fi
REQUESTED=$EXTRA
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
TORCH_BEFORE=$(.venv/bin/python -c 'import torch; print(torch.__version__)')
echo "install: exatrain${EXTRA:+[$EXTRA]}"
.venv/bin/pip install -q --disable-pip-version-check -e ".${EXTRA:+[$EXTRA]}"
TORCH_AFTER=$(.venv/bin/python -c 'import torch; print(torch.__version__)')
if [ "$TORCH_AFTER" != "$TORCH_BEFORE" ]; then
  echo "install: pip replaced torch $TORCH_BEFORE by $TORCH_AFTER. HINT: pin the companion packages of the" \
       "extras to the releases built for torch $TORCH_BEFORE, then run: .venv/bin/pip install $TORCH_SPEC" >&2
  exit 1
fi
if [[ ",$EXTRA," == *",examples,"* ]]; then
  # PyPI's torchvision is a CUDA build: next to a CPU-only torch its import fails (see the hook's docstring).
  SITE=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  rm -f "$SITE/_exatrain_torchvision_cpu.pth" "$SITE/_exatrain_torchvision_cpu.py"
  if ! TV_ERR=$(.venv/bin/python -c "import torchvision" 2>&1); then
    if ! grep -q "operator torchvision::nms does not exist" <<<"$TV_ERR"; then
      echo "$TV_ERR" >&2; exit 1
    fi
    echo "install: torchvision (CUDA build) on CPU-only torch: adding scripts/torchvision_cpu_hook.py to the venv"
    cp scripts/torchvision_cpu_hook.py "$SITE/_exatrain_torchvision_cpu.py"
    echo "import _exatrain_torchvision_cpu" > "$SITE/_exatrain_torchvision_cpu.pth"
    .venv/bin/python -c "import torchvision"
  fi
fi
if [ "$HOROVOD" = 1 ]; then bash scripts/build_horovod.sh; fi
[ "$HAVE" = "-" ] && HAVE=""
printf '%s\n%s\n' "$KEY" "$(echo "$HAVE,$REQUESTED" | tr , '\n' | sed '/^$/d' | sort -u | paste -sd,)" > "$STAMP"
echo "install: done ($(.venv/bin/exatrain --version), torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'))"
