"""Fixtures of the GPU tests (tests/gpu)."""

import pytest
import torch
import torch.distributed as dist


@pytest.fixture
def nccl_group_of_one():
    """A real NCCL process group of one rank on GPU 0, destroyed afterwards."""
    torch.cuda.set_device(0)
    dist.init_process_group(
        "nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("cuda", 0)
    )
    yield
    dist.destroy_process_group()
