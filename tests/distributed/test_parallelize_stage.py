"""parallelize() on a pipeline-stage-like chunk (no output head, one of two blocks), on 2 real gloo ranks:
TP plan entries for missing modules are skipped, every kept parameter equals the reference model's
exactly after load_full_state_dict, and a block computes what the reference block computes (fp32,
tolerance 1e-5: TP sums partial products in another order)."""

import pytest
import torch

from exatrain.config import load_config
from exatrain.distributed import init_distributed, teardown
from exatrain.distributed.parallel_dims import ParallelDims
from exatrain.distributed.parallelize import parallelize
from exatrain.distributed.state_dict import load_full_state_dict
from exatrain.models.tp_plan import tp_plan
from exatrain.models.transformer import build_model
from tests.distributed.helpers import spawn

pytestmark = pytest.mark.dist

LAYOUTS = {
    "tp": ["--parallel.dp_replicate=1", "--parallel.tp=2"],
    "fsdp_ac": [
        "--parallel.dp_replicate=1",
        "--parallel.dp_shard=2",
        "--parallel.activation_checkpoint=full",
    ],
}


def _reference():
    torch.manual_seed(3)
    return build_model("tiny", 64, 16)


def _worker(rank, world, env, overrides):
    torch.set_num_threads(1)
    init_distributed(env, "cpu", timeout_s=60)
    cfg = load_config(None, overrides).parallel
    dims = ParallelDims.from_config(cfg, world)
    dims.build_mesh("cpu")
    ref = _reference()
    with torch.device("meta"):
        stage = build_model("tiny", 64, 16)
    del stage.output, stage.layers["1"]  # what a first pipeline stage of two keeps
    parallelize(stage, stage.layers, dims, cfg, tp_plan(stage.layers.keys()), "cpu")
    load_full_state_dict(stage, ref.state_dict(), torch.device("cpu"))
    full = ref.state_dict()
    for name, p in stage.state_dict().items():
        value = p.full_tensor() if hasattr(p, "full_tensor") else p
        assert torch.equal(value, full[name]), name
    assert "output.weight" not in stage.state_dict() and "layers.1.ffn.w1.weight" not in stage.state_dict()
    x = torch.randn(2, 16, 128, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(stage.layers["0"](x), ref.layers["0"](x), atol=1e-5, rtol=0)
    teardown()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_stage_chunk_is_parallelised_and_loaded(layout):
    spawn(_worker, 2, LAYOUTS[layout])
