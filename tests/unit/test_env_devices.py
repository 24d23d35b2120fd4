"""GPU visibility and device choice, without torch."""

import pytest

from exatrain.env.devices import count_node_gpus, pick_device_index, visibility, visibility_problem
from exatrain.errors import ClusterEnvError


def test_visibility_unset_empty_and_lists():
    seen = visibility({"CUDA_VISIBLE_DEVICES": "0,1", "ROCR_VISIBLE_DEVICES": "", "GPU_DEVICE_ORDINAL": "3"})
    assert seen == {
        "CUDA_VISIBLE_DEVICES": ["0", "1"],
        "HIP_VISIBLE_DEVICES": None,
        "ROCR_VISIBLE_DEVICES": [],
        "GPU_DEVICE_ORDINAL": ["3"],
    }


@pytest.mark.parametrize(
    ("local_rank", "local_world_size", "visible", "index"),
    [
        (3, 4, 1, 0),  # --gpus-per-task=1: SLURM renumbered the task's GPU to 0
        (0, 1, 1, 0),
        (3, 4, 4, 3),  # --gpus-per-node=4: the whole node is visible
        (1, 2, 8, 1),  # more GPUs than tasks
    ],
)
def test_pick_device_index(local_rank, local_world_size, visible, index):
    assert pick_device_index(local_rank, local_world_size, visible) == index


@pytest.mark.parametrize(
    ("local_rank", "local_world_size", "visible", "words"),
    [
        (3, 4, 2, ["4 tasks", "2 visible GPUs", "--gpus-per-task=1"]),
        (1, 3, 2, ["3 tasks", "--gpus-per-task=1"]),
        (0, 2, 0, ["no GPU"]),
        (2, 2, 2, ["local rank 2"]),
    ],
)
def test_pick_device_index_refuses(local_rank, local_world_size, visible, words):
    with pytest.raises(ClusterEnvError) as info:
        pick_device_index(local_rank, local_world_size, visible)
    text = str(info.value)
    assert "HINT:" in text
    assert all(word in text for word in words)


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"CUDA_VISIBLE_DEVICES": "0,1,2,3"},
        {"ROCR_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "1"},
        {"ROCR_VISIBLE_DEVICES": "5", "HIP_VISIBLE_DEVICES": "0"},  # LUMI local task 0: fine
        {"ROCR_VISIBLE_DEVICES": "5"},
        {"ROCR_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "GPU-1234"},
    ],
)
def test_no_visibility_problem(environ):
    assert visibility_problem(environ) is None


@pytest.mark.parametrize(
    ("environ", "name"),
    [
        ({"ROCR_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "1"}, "HIP_VISIBLE_DEVICES"),  # $SLURM_LOCALID
        ({"ROCR_VISIBLE_DEVICES": "4,5", "CUDA_VISIBLE_DEVICES": "0,2"}, "CUDA_VISIBLE_DEVICES"),
        ({"ROCR_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "0"}, "HIP_VISIBLE_DEVICES"),
    ],
)
def test_visibility_problem(environ, name, tmp_path):
    (tmp_path / "sys/class/kfd/kfd/topology/nodes").mkdir(parents=True)  # a fake AMD node (none here)
    message = visibility_problem(environ, str(tmp_path))
    assert message is not None
    assert name in message and "ROCR_VISIBLE_DEVICES" in message
    assert "\nHINT: " in message


def test_slurm_gres_binding_on_nvidia_nodes_is_fine(tmp_path):
    """--gpus-per-task=1, local task 1: SLURM sets CUDA=ROCR=1; CUDA ignores ROCR_VISIBLE_DEVICES."""
    assert (
        visibility_problem({"CUDA_VISIBLE_DEVICES": "1", "ROCR_VISIBLE_DEVICES": "1"}, str(tmp_path)) is None
    )
    assert (
        visibility_problem({"HIP_VISIBLE_DEVICES": "1", "ROCR_VISIBLE_DEVICES": "1"}, str(tmp_path))
        is not None
    )


def test_count_node_gpus_empty_tree(tmp_path):
    assert count_node_gpus(str(tmp_path)) == 0


def test_count_node_gpus_nvidia(tmp_path):
    gpus = tmp_path / "proc/driver/nvidia/gpus"
    for bus in ("0000:07:00.0", "0000:0b:00.0", "0000:48:00.0", "0000:4c:00.0"):
        (gpus / bus).mkdir(parents=True)
    assert count_node_gpus(str(tmp_path)) == 4


def test_count_node_gpus_amd_skips_cpu_nodes(tmp_path):
    nodes = tmp_path / "sys/class/kfd/kfd/topology/nodes"
    for index, gpu_id in enumerate(["0", "0", "41755", "7062\n", ""]):
        (nodes / str(index)).mkdir(parents=True)
        (nodes / str(index) / "gpu_id").write_text(gpu_id)
    assert count_node_gpus(str(tmp_path)) == 2
