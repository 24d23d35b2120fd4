"""ParallelDims.build_mesh on 4 real gloo ranks: named sub-meshes and coordinates as the layout says."""

import json

import pytest

from exatrain.config import load_config
from exatrain.distributed import init_distributed, teardown
from exatrain.distributed.parallel_dims import ParallelDims
from tests.distributed.helpers import spawn

pytestmark = pytest.mark.dist

LAYOUTS = {
    "hsdp": ["--parallel.dp_replicate=2", "--parallel.dp_shard=2"],
    "pp_fsdp": ["--parallel.pp=2", "--parallel.dp_replicate=1", "--parallel.dp_shard=2"],
}


def _worker(rank, world, env, out):
    init_distributed(env, "cpu", timeout_s=60)
    result = {}
    for name, overrides in LAYOUTS.items():
        dims = ParallelDims.from_config(load_config(None, overrides).parallel, world)
        dims.build_mesh("cpu")
        result[name] = {
            n: (None if dims.mesh(n) is None else dims.mesh(n).size(), dims.coordinate(n))
            for n in ("pp", "dp_replicate", "dp_shard", "tp", "dp")
        }
        fsdp = dims.mesh("fsdp")
        result[name]["fsdp_ndim"] = fsdp.ndim
    teardown()
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(result, f)


def test_named_meshes_and_coordinates(tmp_path):
    spawn(_worker, 4, str(tmp_path))
    r = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(4)]
    # HSDP (2 x 2): ranks 0,1 replicate 0; 'dp' is the flattened 4-rank view
    for rank, res in enumerate(r):
        h = res["hsdp"]
        assert h["dp_replicate"] == [2, rank // 2] and h["dp_shard"] == [2, rank % 2]
        assert h["dp"] == [4, rank] and h["tp"] == [None, 0] and h["pp"] == [None, 0]
        assert h["fsdp_ndim"] == 2
        p = res["pp_fsdp"]
        assert p["pp"] == [2, rank // 2] and p["dp"] == [2, rank % 2] and p["fsdp_ndim"] == 1
