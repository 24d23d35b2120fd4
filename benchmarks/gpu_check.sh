#!/usr/bin/env bash
# The GPU checks of one lent device call, in one script (docs/performance.md, benchmarks/RESULTS.md GPU
# section): the GPU tests, gpu_mfu's xl step, and the plan's prediction of that step from constants the
# doctor measured on the same GPU a minute before.
#
#   bash benchmarks/gpu_check.sh OUTDIR [SIZES]   (one CUDA GPU and torch installed; SIZES: "xl" by
#                                                 default, e.g. "medium large"; tests/gpu runs when SIZES is "xl")
#
# A size is gpu_mfu's: a named one (medium, large, xl: gpu_mfu's batch unless SIZE:BATCH gives one) or
# DIMxLAYERSxHEADS:BATCH, e.g. "2048x24x16:14" for MPT-1b's shape and per-GPU batch; VOCAB (default 32000)
# sets the vocabulary of every size. A size ending in ":plan" (e.g. "4096x32x32:6:plan", a shape too large
# to train on one GPU) runs the doctor and the plan only. VARIANTS (default "plain,exatrain") are the sides
# gpu_mfu times; DROPOUT (default 0) is the model's dropout in all three.
#
# Wheels the image lacks (python-hostlist, torchdata) are installed from .whl/ if that folder exists.
# Each phase has its own time limit, so one that hangs leaves the others their time; each writes its
# log to OUTDIR as it goes.
set -u -o pipefail
out=${1:?usage: gpu_check.sh OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv | tee "$out/info.log"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$out/info.log"

sizes=${2:-xl}
vocab=${VOCAB:-32000}
declare -A batch=([medium]=32 [large]=16 [xl]=8)  # gpu_mfu's samples per step at T = 2048
variants=${VARIANTS:-plain,exatrain}
dropout=${DROPOUT:-0}
for entry in $sizes; do
    plan_only=false
    if [[ $entry == *:plan ]]; then
        plan_only=true
        entry=${entry%:plan}
    fi
    size=${entry%%:*}
    if [[ $entry == *:* ]]; then
        b=${entry#*:}
    else
        b=${batch[$size]:-}
        [ -n "$b" ] || { echo "gpu_check.sh: size $size needs a batch: $size:BATCH" >&2; exit 2; }
    fi
    model=(--model.size=$size)
    if [[ $size == [0-9]* ]]; then  # DIMxLAYERSxHEADS on the xl preset, as gpu_mfu builds it
        IFS=x read -r dim layers heads <<< "$size"
        model=(--model.size=xl --model.dim=$dim --model.n_layers=$layers --model.n_heads=$heads)
    fi
    # the job gpu_mfu times: batch b x 2048, bf16 autocast, blocks compiled, vocabulary $vocab (a text
    # corpus of vocab - 2 words + <eos>, <unk>; no corpus is read)
    job=("${model[@]}" --data.kind=text --data.seq_len=2048 --data.max_vocab=$((vocab - 2))
        --train.global_batch_size=$b --train.micro_batch_size=$b --train.precision=bf16 --parallel.compile=true
        --model.dropout=$dropout)
    echo "== doctor and plan: $size (constants measured on the job's shapes)" | tee -a "$out/info.log"
    timeout 120 python3 -m exatrain doctor --nproc 1 --device cuda "${job[@]}" 2>&1 | tee "$out/doctor-$size.log"
    # a copy of the generic NVIDIA profile with the printed [hardware] table and the data sheet's peak
    # (H100 and H200 SXM: 989 TFLOP/s dense bf16) for MFU
    site=/tmp/here-gpu-$size.toml
    { cat exatrain/slurm/profiles/generic-nvidia.toml; sed -n '/^\[hardware\]$/,$p' "$out/doctor-$size.log"
      echo "peak_tflops = 989.0"; } > "$site"
    timeout 120 python3 -m exatrain plan --site "$site" --world-size 1 --time "${job[@]}" 2>&1 | tee "$out/plan-$size.log"
    $plan_only && continue
    echo "== gpu_mfu: $size" | tee -a "$out/info.log"
    timeout 300 python3 -m benchmarks.gpu_mfu --sizes "$size" --batch "$b" --vocab "$vocab" --reps 3 \
        --variants "$variants" --dropout "$dropout" 2>&1 | tee "$out/mfu-$size.log"
done

[ "$sizes" = xl ] || exit 0
echo "== tests/gpu" | tee -a "$out/info.log"
timeout 240 python3 -m pytest tests/gpu -ra -p no:cacheprovider 2>&1 | tee "$out/gpu.log"
