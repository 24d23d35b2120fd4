"""Which GPU a rank should use, read from visibility variables and /proc, /sys (no torch import)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from exatrain.errors import ClusterEnvError

VISIBILITY_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
)


def visibility(environ: Mapping[str, str]) -> dict[str, list[str] | None]:
    """Each visibility variable as a list of device ids; None when unset, ``[]`` when set to empty (no
    GPU)."""
    return {
        name: None
        if name not in environ
        else [item.strip() for item in environ[name].split(",") if item.strip()]
        for name in VISIBILITY_VARS
    }


def pick_device_index(local_rank: int, local_world_size: int, visible_count: int) -> int:
    """The torch device index for this rank, given how many GPUs the process can see.

    One visible GPU means SLURM already bound one per task (``--gpus-per-task=1``): it is device 0, and
    indexing by local rank would be out of range. At least one GPU per local task means the whole node is
    visible (``--gpus-per-node``): use the local rank. Anything in between means tasks would share GPUs.
    """
    if not 0 <= local_rank < local_world_size:
        raise ClusterEnvError(
            f"local rank {local_rank} is outside 0..{local_world_size - 1}",
            "pass the local rank and local world size of the detected environment",
        )
    if visible_count == 1:
        return 0
    if visible_count >= local_world_size:
        return local_rank
    if visible_count == 0:
        raise ClusterEnvError(
            "this process sees no GPU (the visibility variables leave none, or the node has none)",
            "request GPUs from SLURM (--gpus-per-task=1 or --gpus-per-node=N), check CUDA_VISIBLE_DEVICES/"
            "ROCR_VISIBLE_DEVICES, or train on CPU",
        )
    raise ClusterEnvError(
        f"{local_world_size} tasks on this node share {visible_count} visible GPUs; "
        "splitting them by local rank would put several ranks on one GPU",
        "request one GPU per task (--gpus-per-task=1) or as many tasks per node as GPUs "
        f"(--ntasks-per-node={visible_count})",
    )


def visibility_problem(environ: Mapping[str, str], root: str = "/") -> str | None:
    """Warn when HIP/CUDA_VISIBLE_DEVICES index past what ROCR_VISIBLE_DEVICES left; else None.

    The ROCm runtime applies ROCR_VISIBLE_DEVICES first and then HIP/CUDA_VISIBLE_DEVICES to the
    renumbered survivors, so ``HIP_VISIBLE_DEVICES=$SLURM_LOCALID`` on top of SLURM's per-task ROCR
    binding leaves zero devices for every task but the first. CUDA_VISIBLE_DEVICES counts only on nodes
    with AMD GPUs (KFD under ``root``): SLURM's gres sets it next to ROCR_VISIBLE_DEVICES on every GPU
    node, and NVIDIA's runtime ignores ROCR_VISIBLE_DEVICES.
    """
    seen = visibility(environ)
    rocr = seen["ROCR_VISIBLE_DEVICES"]
    if rocr is None:
        return None
    amd = (Path(root) / "sys/class/kfd/kfd/topology/nodes").is_dir()
    for name in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES") if amd else ("HIP_VISIBLE_DEVICES",):
        beyond = [i for i in seen[name] or [] if i.isdigit() and int(i) >= len(rocr)]
        if beyond:
            return (
                f"{name}={environ[name]} selects device {beyond[0]}, but ROCR_VISIBLE_DEVICES="
                f"{environ['ROCR_VISIBLE_DEVICES']} leaves only {len(rocr)} device(s), renumbered from 0: "
                "the two compose and this process will see fewer GPUs than intended (possibly none)\n"
                f"HINT: set only one of them: keep SLURM's ROCR_VISIBLE_DEVICES binding and unset {name} "
                f"(do not set {name}=$SLURM_LOCALID on top of --gpus-per-task/--gpu-bind)"
            )
    return None


def count_node_gpus(root: str = "/") -> int:
    """Number of GPUs on this node from the driver's files (NVIDIA /proc, AMD KFD topology), without torch.

    ``root`` lets tests point at a fake tree. Returns 0 when neither driver is present.
    """
    base = Path(root)
    nvidia = base / "proc/driver/nvidia/gpus"
    count = sum(1 for _ in nvidia.iterdir()) if nvidia.is_dir() else 0
    # KFD lists CPU NUMA nodes too; they have gpu_id 0.
    for gpu_id in base.glob("sys/class/kfd/kfd/topology/nodes/*/gpu_id"):
        try:
            count += gpu_id.read_text().strip() not in ("", "0")
        except OSError:
            continue
    return count


def narrowed_ids(seen: Mapping[str, list[str] | None]) -> list[str] | None:
    """The GPU ids the first set visibility variable leaves (from `visibility(...)`), or None when none is
    set.

    GPU_DEVICE_ORDINAL only mirrors the others; CUDA/HIP/ROCR narrow what the process sees."""
    return next((v for k, v in seen.items() if v is not None and k != "GPU_DEVICE_ORDINAL"), None)


def describe_devices(
    local_rank: int, local_world_size: int, environ: Mapping[str, str] | None = None, root: str = "/"
) -> dict:
    """What `exatrain env` reports about GPUs, without torch: visible count, the device this rank would
    use (``cuda:N`` or ``cpu``) and the visibility variables that are set."""
    import os

    vis = visibility(os.environ if environ is None else environ)
    narrowed = narrowed_ids(vis)
    count = len(narrowed) if narrowed is not None else count_node_gpus(root)
    device = f"cuda:{pick_device_index(local_rank, local_world_size, count)}" if count else "cpu"
    return {
        "visible_gpus": count,
        "device": device,
        "visibility": {k: v for k, v in vis.items() if v is not None},
    }
