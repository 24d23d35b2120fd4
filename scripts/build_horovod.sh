#!/usr/bin/env bash
# Build Horovod 0.28.1 for this venv's torch and install it: once per machine, the wheel is cached.
#   bash scripts/build_horovod.sh          (scripts/install.sh horovod runs it)
# Horovod's last release forces C++14 in two CMakeLists; torch 2.x headers need C++17. This builds it with
# C++17, the PyTorch framework and the gloo controller (no MPI), ~8 min on 2 cores. The wheel is cached in
# $EXATRAIN_WHEEL_CACHE (default ~/.cache/exatrain/wheels) per Horovod, torch and Python version.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VER=0.28.1
PY=.venv/bin/python
key=$($PY -c 'import sys, torch; print(f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}")')
CACHE=${EXATRAIN_WHEEL_CACHE:-$HOME/.cache/exatrain/wheels}/horovod-$VER-$key
if ! ls "$CACHE"/horovod-*.whl >/dev/null 2>&1; then
  echo "build_horovod: building horovod $VER for $key (about 8 minutes on 2 cores; cached in $CACHE)"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  .venv/bin/pip install -q --disable-pip-version-check wheel packaging
  .venv/bin/pip download -q --disable-pip-version-check --no-deps --no-binary :all: "horovod==$VER" -d "$work"
  tar xzf "$work/horovod-$VER.tar.gz" -C "$work"
  src="$work/horovod-$VER"
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
  HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_MPI=1 \
    HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=gloo MAKEFLAGS=-j${BUILD_JOBS:-2} \
    .venv/bin/pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation -w "$work/dist" "$src"
  mkdir -p "$(dirname "$CACHE")"
  mkdir "$work/cache" && mv "$work"/dist/horovod-*.whl "$work/cache/"
  rm -rf "$CACHE" && mv "$work/cache" "$CACHE"   # the cache appears complete or not at all
fi
.venv/bin/pip install -q --disable-pip-version-check --no-deps "$CACHE"/horovod-*.whl
.venv/bin/pip install -q --disable-pip-version-check cloudpickle psutil pyyaml packaging cffi
echo "build_horovod: $($PY -c 'import horovod.torch as hvd; import horovod; print("horovod", horovod.__version__)') installed (gloo: $($PY -c 'import horovod.torch as hvd; print(hvd.gloo_built())'))"
