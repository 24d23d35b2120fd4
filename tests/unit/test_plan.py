"""`exatrain plan`: a 16,384-rank layout checked in one process, bad layouts refused with a HINT,
and the activation formula against the bytes autograd really saves.

The 16,384-rank case uses torch's fake process group (no real ranks: this machine has 2 cores); the
per-rank parameter/gradient/optimizer bytes are checked against real gloo ranks in
tests/distributed/test_plan_memory.py.
"""

import json
from dataclasses import replace

import pytest
import torch

from exatrain.config import load_config
from exatrain.errors import ConfigError
from exatrain.models import model_shape
from exatrain.models.transformer import build_model
from exatrain.tools.plan import make_plan, memory

# xl (~1B parameters, 16 heads, 18 blocks) on 16,384 GPUs:
# 4 pipeline ranks x 8 replicas x 64-way FSDP x 8-way TP
HUGE = [
    "--model.size=xl",
    "--data.seq_len=4096",
    "--parallel.pp=4",
    "--parallel.dp_replicate=8",
    "--parallel.dp_shard=64",
    "--parallel.tp=8",
    "--train.micro_batch_size=4",
    "--train.global_batch_size=8192",
    "--parallel.activation_checkpoint=full",
]


def test_16384_ranks_in_one_process(exatrain_cli):
    """No wall-clock bound (the machine may be loaded); the timeout only guards against a hang."""
    r = exatrain_cli(
        "plan",
        "--world-size",
        "16384",
        "--site",
        "generic-nvidia",
        "--vocab-size",
        "32000",
        "--json",
        *HUGE,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["world_size"] == 16384 and plan["degrees"] == {
        "pp": 4,
        "dp_replicate": 8,
        "dp_shard": 64,
        "tp": 8,
    }
    assert [x["rank"] for x in plan["ranks"]] == [0, 4096, 8192, 12288]
    assert sum(sum(x["blocks"]) for x in plan["ranks"]) == 18  # every block on exactly one pipeline rank
    # by hand: a block holds 12 D^2 weights split tp x dp_shard ways (+ norms, not TP-split); stage 0 adds the
    # token and position embeddings, the last stage the output head (all TP-split by rows) and norm; fp32
    D, shard = 2048, 64
    block = 12 * D * D / (8 * shard) + 2 * D / shard
    ends = {0: (32000 + 4096) * D / (8 * shard), 12288: 32000 * D / (8 * shard) + D / shard}
    for x in plan["ranks"]:
        expected = 4 * (sum(x["blocks"]) * block + ends.get(x["rank"], 0))
        assert abs(x["params"] - expected) <= 0.01 * expected, (x["rank"], x["params"], expected)
        assert x["grads"] == x["params"] and x["optimizer"] >= 2 * x["params"]
        assert x["total"] < 80 * 1024**3
    assert plan["gpu_memory_gb"] == 80 and plan["verdict"].startswith("fits")


def test_table_output(exatrain_cli):
    r = exatrain_cli(
        "plan",
        "--world-size",
        "8",
        "--gpu-memory-gb",
        "0.001",
        "--model.size=small",
        "--train.global_batch_size=64",
        "--parallel.dp_replicate=2",
        "--parallel.dp_shard=2",
        "--parallel.tp=2",
    )
    assert r.returncode == 0, r.stderr
    assert "total per GPU" in r.stdout and "does not fit" in r.stdout and "HSDP, TP" in r.stdout
    # redirected output is not wrapped at 80 columns: the long header stays one line
    header = next(line for line in r.stdout.splitlines() if line.startswith("layout:"))
    assert len(header) > 80 and header.rstrip().endswith("s)"), r.stdout


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["--parallel.tp=3", "--parallel.dp_replicate=-1"], "does not divide"),
        (["--parallel.dp_replicate=3", "--parallel.dp_shard=5"], "does not match the world size"),
        (["--parallel.pp=32", "--parallel.dp_replicate=-1"], "pipeline stages"),
    ],
)
def test_invalid_layout_fails_fast_with_hint(exatrain_cli, overrides, expected):
    r = exatrain_cli(
        "plan",
        "--world-size",
        "96",
        "--model.size=medium",
        "--train.micro_batch_size=1",
        "--train.global_batch_size=96",
        *overrides,
        timeout=300,
    )
    assert r.returncode == 2 and expected in r.stderr and "HINT:" in r.stderr, r.stderr


def test_world_size_out_of_range():
    with pytest.raises(ConfigError, match="world-size"):
        make_plan(load_config(), 32768)
    with pytest.raises(ConfigError, match="vocab-size"):
        make_plan(load_config(), 2, vocab_size=0)


def _saved_bytes(model, x) -> int:
    """Bytes of the tensors autograd saves for backward in one forward (parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x, x)
    return sum(n for ptr, n in seen.items() if ptr not in params)


@pytest.mark.parametrize("size, batch, seq, vocab", [("small", 4, 128, 512), ("medium", 2, 256, 1000)])
def test_activation_estimate_matches_saved_tensors(size, batch, seq, vocab):
    """fp32 on CPU, no checkpointing: the per-block formula plus head within 10 % of what autograd keeps."""
    torch.manual_seed(0)
    model = build_model(size, vocab, seq)
    measured = _saved_bytes(model, torch.randint(vocab, (batch, seq)))
    spec = memory.ActivationSpec(shape=model_shape(size), vocab=vocab, seq_len=seq, batch=batch, elem_bytes=4)
    estimate = memory.stage_activation_bytes(model.shape.n_layers, True, spec)
    assert abs(estimate - measured) <= 0.10 * measured, (estimate, measured)


def test_dropout_keeps_one_bool_mask_per_block():
    """With dropout each block keeps its MLP output's bool mask, B*T*D bytes (/ tp under sequence parallel),
    and nothing for the attention's dropout, which the fused kernel draws inside: on one H200, xl at
    dropout 0.1 kept 0.60 GiB more at 8 x 2048 tokens, 18 blocks x 16384 x 2048 bytes = 0.5625 GiB plus
    the embeddings' mask (benchmarks/RESULTS.md, GPU section)."""
    spec = memory.ActivationSpec(shape=model_shape("xl"), vocab=32000, seq_len=2048, batch=8, elem_bytes=2)
    btd = 8 * 2048 * 2048
    for s in (spec, replace(spec, tp=4, sequence_parallel=True)):
        added = memory.block_activation_bytes(replace(s, dropout=True)) - memory.block_activation_bytes(s)
        assert added == btd / (4 if s.sequence_parallel else 1)


def test_checkpointing_and_tp_shrink_the_estimate():
    spec = memory.ActivationSpec(shape=model_shape("xl"), vocab=32000, seq_len=4096, batch=1, elem_bytes=2)
    none = memory.stage_activation_bytes(18, False, spec)
    full = memory.stage_activation_bytes(18, False, replace(spec, ac="full"))
    every = memory.stage_activation_bytes(18, False, replace(spec, ac="every", ac_every=2))
    tp = memory.stage_activation_bytes(18, False, replace(spec, tp=8))
    sp = memory.stage_activation_bytes(18, False, replace(spec, tp=8, sequence_parallel=True))
    assert full < every < none
    # bf16 under TP and SP: only the order. The bf16 terms were read off one H100 without TP
    # (benchmarks/RESULTS.md; their split under TP/SP is assumed) and cannot be measured here: on the CPU,
    # autocast's RMSNorm also keeps its normalised input in fp32 (16 bytes per B*T*D per block where the H100
    # kept 8), so on 2 gloo ranks this estimate is 0.78 (TP) and 0.86
    # (TP + SP) of the saved tensors (bf16 weight copies excluded)
    assert sp < tp < none
    fp32 = memory.stage_activation_bytes(18, False, replace(spec, elem_bytes=4))
    fp32_tp = memory.stage_activation_bytes(18, False, replace(spec, elem_bytes=4, tp=8))
    fp32_sp = memory.stage_activation_bytes(
        18, False, replace(spec, elem_bytes=4, tp=8, sequence_parallel=True)
    )
    # fp32 under TP and SP: checked against real ranks' saved tensors in tests/distributed/test_plan_memory.py
    assert fp32_sp < fp32_tp < fp32 / 2


def test_pipeline_microbatches_in_flight():
    assert memory.microbatches_in_flight("1f1b", 4, 0, 8, 1) == 4
    assert memory.microbatches_in_flight("1f1b", 4, 3, 8, 1) == 1
    assert memory.microbatches_in_flight("gpipe", 4, 3, 8, 1) == 8
    assert memory.microbatches_in_flight("interleaved_1f1b", 4, 0, 8, 2) == 2 * 3 + 4 + 1
    assert memory.microbatches_in_flight("1f1b", 1, 0, 8, 1) == 1


def test_site_profiles_give_the_gpu_memory():
    from exatrain.config.load import read_toml
    from exatrain.slurm.profiles import PROFILE_DIR, load_profile, profile_from_dict

    assert {
        n: load_profile(n).gpu_memory_gb for n in ("lumi-g", "juwels-booster", "generic-nvidia", "cpu")
    } == {"lumi-g": 64.0, "juwels-booster": 40.0, "generic-nvidia": 80.0, "cpu": 0.0}
    data = read_toml(str(PROFILE_DIR / "lumi-g.toml"))
    with pytest.raises(ConfigError, match="gpu_memory_gb must be float"):
        profile_from_dict({**data, "gpu_memory_gb": "lots"})
    assert memory.verdict(10 * 2**30, None).startswith("unknown")
    assert memory.verdict(10 * 2**30, 40).startswith("fits") and memory.verdict(39 * 2**30, 40).startswith(
        "tight"
    )


@pytest.mark.parametrize("ac, every", [("full", 1), ("every", 2)])
def test_checkpointed_activation_estimate_matches_saved_tensors(ac, every):
    """Activation checkpointing applied by the training code (apply_ac), measured as the plain case: what
    autograd keeps after the forward (the checkpointed blocks' inputs, the other blocks, the head) against the
    formula, less the one block the formula adds for the recomputation peak in backward (that block's bytes
    are the plain block's, checked above), within 10 %."""
    from exatrain.distributed.parallelize import apply_ac

    size, batch, seq, vocab = "medium", 2, 128, 1000
    torch.manual_seed(0)
    model = build_model(size, vocab, seq)
    apply_ac(model.layers, ac, every)
    measured = _saved_bytes(model, torch.randint(vocab, (batch, seq)))
    spec = memory.ActivationSpec(
        shape=model_shape(size), vocab=vocab, seq_len=seq, batch=batch, elem_bytes=4, ac=ac, ac_every=every
    )
    estimate = memory.stage_activation_bytes(
        model.shape.n_layers, True, spec
    ) - memory.block_activation_bytes(spec)
    assert abs(estimate - measured) <= 0.10 * measured, (estimate, measured)
