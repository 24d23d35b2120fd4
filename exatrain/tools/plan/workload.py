"""What one training step of a layout runs, as the step-time model needs it (torch-free at import): the
code the ranks run (`Code`: exatrain's own trainer, or a published run's code), the kernels and their
memory-bound bytes (exatrain.tools.plan.traffic), each pipeline rank's own work, the closed-form model and
batch split of the collectives (exatrain.tools.plan.analytic), and the step-time inputs that
exatrain.tools.plan.estimate turns into a step time. `exatrain plan` (planner.py) and `--search`
(search.py) both predict through `step_inputs`.
"""

from __future__ import annotations

from dataclasses import dataclass

from exatrain.config import Config
from exatrain.distributed.parallel_dims import ParallelDims
from exatrain.models import configured_shape
from exatrain.observe.flops import attention_flops_per_token, transformer_flops_per_token
from exatrain.tools.plan import analytic, estimate, traffic


@dataclass(frozen=True)
class Code:
    """What the ranks' code runs where the step-time model has a choice. exatrain's own trainer is
    own_code(gpus_per_node); the published runs of docs/plan-validation.md set what their
    code did (the [source.*] facts of tests/data/plan_validation.toml, each cited there)."""

    norm: str = "fused"  # RMSNorm: torch's fused kernel (GPUs) or its "composite" decomposition (CPUs)
    attention: str = "fused"  # scaled_dot_product_attention, or "materialised" scores and softmax in memory
    stage_layers: tuple[int, ...] | None = None  # blocks per pipeline stage, where the code's split differs
    reduce_after_backward: bool = False  # gradients reduced after the step's whole backward (estimate)
    # weights, activations and gradients in 16 bits under plain data parallelism (Megatron-LM's
    # Float16Module, DeepSpeed's bf16 engine): no weight casts, 2-byte tensor-parallel reductions and
    # pipeline sends, 2-byte gradient reductions unless fp32_gradients
    weights_16bit: bool = False
    # norms that read and write 16-bit tensors (fp32 inside: apex's fused LayerNorm under Megatron-LM's
    # Float16Module or DeepSpeed's bf16 engine, llm-foundry's LPLayerNorm), where exatrain's RMSNorm runs on
    # autocast's fp32 list; with 16-bit parameters nothing else is cast but the logits (traffic.module_16bit)
    norms_16bit: bool = False
    # how gradients accumulate over micro-batches (traffic.ACCUMULATIONS): as autograd and FSDP2 do it
    # (exatrain's trainer), Megatron-LM's 16-bit main_grad, DeepSpeed's bf16 optimizer, "none" (not modelled)
    accumulation: str = "autograd"
    # the gradients all-reduced in fp32 (DeepSpeed's bf16 engine with communication_data_type fp32; by
    # default it casts its fp32 copies to bf16 for the all-reduce)
    fp32_gradients: bool = False
    # pipeline sends under tensor parallelism (analytic.PIPELINE_SENDS): whole tensors (torch's pipelining),
    # split over the tensor-parallel ranks and gathered on arrival (Megatron-LM's "scatter_gather"), or so
    # and the sent output gathered again for its backward (DeepSpeed's pipeline engine, "partitioned")
    pipeline_sends: str = "whole"
    # which layouts torch's DistributedDataParallel reduces (traffic.ddp_bytes: its bucket copies):
    # "exatrain" (its trainer's rule: replicated layouts without TP or PP), "torch" (every data-parallel
    # layout: Megatron-LM's DDP=torch) or "none" (a code's own reduction: Megatron-LM's local DDP, DeepSpeed)
    ddp: str = "exatrain"
    # the optimizer step's memory traffic (estimate.OPTIMIZER_BYTES): a fused AdamW (exatrain), Megatron-LM's
    # fp16 optimizer (gradient copies to fp32, unscaling, the clipping norm, parameter copies), or DeepSpeed's
    # BF16_Optimizer (its own ZeRO-1: each data-parallel rank updates its partition, then all-gathers the
    # bf16 parameters after the step)
    optimizer: str = "adamw"
    # whose cross entropy computes the loss (traffic.LOSS_BYTES): torch's (exatrain), Megatron-LM's
    # vocab-parallel one in place on the logits ("megatron"), or Megatron-DeepSpeed's, which clones them
    # first ("megatron-clone"); both of those on vocabulary shards under TP (parallel.loss_parallel); or
    # flash-attn's fused xentropy kernels on the 16-bit logits ("xentropy", traffic.FUSED_LOSS_ACCESSES)
    loss: str = "torch"
    # how many of a block's two branches end in a dropout (with model.dropout > 0): exatrain's MLP output
    # alone (1), or Megatron-LM's transformer layer, which drops out the attention's output too (2)
    dropout_branches: int = 1
    # whose transformer layer (traffic.Kernels.layer): exatrain's block, or Megatron-LM's ("megatron": its
    # fused QKV split, context copy and bias gradients, and its reentrant checkpoint, which reruns it all), or
    # llm-foundry's MPTBlock ("mpt": its QKV split, bias gradients and triton attention's side kernels)
    layer: str = "exatrain"
    # ALiBi's bias added into the materialised scores by baddbmm with beta = 1 (traffic.alibi_bytes)
    score_bias: bool = False


def step_inputs(
    cfg: Config,
    dims: ParallelDims,
    vocab: int,
    params: int,
    gpus_per_node: int,
    local_param_elements: int,
    code: Code,
) -> estimate.StepInputs:
    """What the step-time model needs of a layout besides its collectives (`gpus_per_node` 0: a CPU node,
    where communication cannot overlap the kernels; `code`: what the ranks run, see Code)."""
    shape = configured_shape(cfg.model)
    matmul = params - (vocab + cfg.data.seq_len) * shape.dim  # as the trainer's MFU counts (train/trainer.py)
    p = cfg.parallel
    fused_attention = attention_flops_per_token(shape.n_layers, shape.dim, cfg.data.seq_len)
    stages = ()
    if dims.pp_enabled:
        stages = stage_loads(cfg, dims, vocab, matmul, code)
    return estimate.StepInputs(
        world_size=dims.world_size,
        gpus_per_node=gpus_per_node or dims.world_size,
        flops_per_token=transformer_flops_per_token(matmul, shape.n_layers, shape.dim, cfg.data.seq_len),
        tokens_per_step=cfg.train.global_batch_size * cfg.data.seq_len,
        recompute_factor=estimate.recompute_factor(p.activation_checkpoint, p.activation_checkpoint_every),
        pp=dims.pp,
        pp_chunks=p.pp_stages_per_rank if dims.pp_enabled else 1,
        microbatches=dims.microbatches(p) if dims.pp_enabled else 1,
        local_param_elements=local_param_elements,
        memory_bytes=memory_traffic(cfg, dims, vocab, code),
        attention_flops_per_token=fused_attention if code.attention == "fused" else 0.0,
        score_flops_per_token=fused_attention if code.attention == "materialised" else 0.0,
        score_bytes=score_traffic(cfg, dims, vocab, code),
        overlap=bool(gpus_per_node),
        stages=stages,
        accumulation=accumulation(cfg, dims),
        reduce_after_backward=code.reduce_after_backward,
        optimizer=code.optimizer,
        optimizer_partitions=dims.dp_replicate if code.optimizer in estimate.PARTITIONED_OPTIMIZERS else 1,
    )


def accumulation(cfg: Config, dims: ParallelDims) -> int:
    """Micro-batches per step on each data-parallel rank (gradient accumulation)."""
    return cfg.train.global_batch_size // (cfg.train.micro_batch_size * dims.dp)


def own_code(gpus_per_node: int) -> Code:
    """What exatrain's own trainer runs: RMSNorm as torch's fused kernel on GPUs, its decomposition on CPU
    nodes (a profile with gpus_per_node = 0)."""
    return Code(norm="fused" if gpus_per_node else "composite")


def traffic_kernels(cfg: Config, dims: ParallelDims, vocab: int, code: Code) -> traffic.Kernels:
    """The kernels a rank of this layout runs, as the byte count of exatrain.tools.plan.traffic needs them."""
    p = cfg.parallel
    sixteen = (dims.fsdp and p.param_dtype == "bf16") or code.weights_16bit
    return traffic.Kernels(
        shape=configured_shape(cfg.model),
        vocab=vocab,
        seq_len=cfg.data.seq_len,
        elem_bytes=compute_bytes(cfg),
        param_bytes=2 if sixteen else 4,
        tp=dims.tp,
        sequence_parallel=dims.tp_enabled and p.sequence_parallel,
        loss_parallel=dims.tp_enabled and p.loss_parallel,
        norm=code.norm,
        attention=code.attention,
        dropout=cfg.model.dropout > 0,
        dropout_branches=code.dropout_branches,
        layer=code.layer,
        score_bias=code.score_bias,
        module_16bit=code.norms_16bit and sixteen,
        accumulation=code.accumulation,
        shard=dims.dp_shard,
        data_parallel=dims.dp_replicate * dims.dp_shard,
        ddp=uses_ddp(dims, code),
        loss=code.loss,
    )


def uses_ddp(dims: ParallelDims, code: Code) -> bool:
    """Whether torch's DistributedDataParallel reduces this layout's gradients under `code`: exatrain's
    trainer wraps replicated layouts without tensor or pipeline parallelism in it (distributed/wrap.py;
    FSDP2's replicate and its own gradient sync elsewhere), Megatron-LM's DDP=torch every layout with more
    than one data-parallel rank."""
    if code.ddp not in ("exatrain", "torch", "none"):
        raise ValueError(f"Code.ddp {code.ddp!r}: exatrain, torch or none")
    replicated = dims.dp_replicate > 1 and not dims.fsdp
    if code.ddp == "torch":
        return replicated
    return code.ddp == "exatrain" and replicated and dims.tp == 1 and dims.pp == 1


def recomputed_blocks(cfg: Config, blocks: float) -> float:
    """Of `blocks` consecutive blocks, how many activation checkpointing recomputes in the backward."""
    p = cfg.parallel
    every = {"full": 1, "every": p.activation_checkpoint_every}.get(p.activation_checkpoint)
    return -(-blocks // every) if every else 0


def rank_work(
    cfg: Config, dims: ParallelDims, blocks: float, embeddings: float, head: float
) -> traffic.RankWork:
    """One rank's work per step: `blocks` blocks and the given shares of the embeddings and the head, over
    the tokens of its data-parallel shard."""
    t = cfg.train
    micro = dims.microbatches(cfg.parallel) if dims.pp_enabled else 1
    return traffic.RankWork(
        tokens=t.global_batch_size * cfg.data.seq_len // dims.dp,
        blocks=blocks,
        recomputed_blocks=recomputed_blocks(cfg, blocks),
        forwards=accumulation(cfg, dims) * micro,
        batch=max(1, t.micro_batch_size // micro),
        embeddings=embeddings,
        head=head,
    )


def average_rank(cfg: Config, dims: ParallelDims, vocab: int, code: Code):
    """The kernels the average rank runs (for `code`, see Code) and its work per step: its share of the
    blocks (n_layers / pp), of the embeddings and the head (1 / pp), over its data-parallel shard's tokens."""
    kernels = traffic_kernels(cfg, dims, vocab, code)
    share = 1 / dims.pp
    return kernels, rank_work(cfg, dims, kernels.shape.n_layers * share, share, share)


def memory_traffic(cfg: Config, dims: ParallelDims, vocab: int, code: Code) -> float:
    """Bytes the memory-bound kernels of the average rank move per step (exatrain.tools.plan.traffic)."""
    return traffic.step_bytes(*average_rank(cfg, dims, vocab, code))


def score_traffic(cfg: Config, dims: ParallelDims, vocab: int, code: Code) -> float:
    """Bytes the average rank's materialised attention products move per step (traffic.score_product_bytes;
    0 with the fused kernel)."""
    return traffic.score_product_bytes(*average_rank(cfg, dims, vocab, code))


def stage_loads(
    cfg: Config,
    dims: ParallelDims,
    vocab: int,
    matmul_params: int,
    code: Code,
) -> tuple[estimate.StageLoad, ...]:
    """Each pipeline rank's own work per step: its stages' blocks (with their recomputation), the
    embeddings on the rank of the first stage, the final norm, head and loss on the rank of the last.
    The slowest rank sets a pipeline's pace, so the step-time model needs them one by one, not the average.
    `code.stage_layers`: blocks per stage in stage order (a run whose code split its layers differently);
    default exatrain's own split (models.pipeline_split.stage_layer_ranges)."""
    from exatrain.distributed.pipeline import stage_ids
    from exatrain.models.pipeline_split import stage_layer_ranges

    shape = configured_shape(cfg.model)
    chunks = cfg.parallel.pp_stages_per_rank
    n_stages = dims.pp * chunks
    layers = code.stage_layers or tuple(len(r) for r in stage_layer_ranges(shape.n_layers, n_stages))
    if len(layers) != n_stages or sum(layers) != shape.n_layers:
        raise ValueError(f"stage_layers {layers}: need {n_stages} stages holding {shape.n_layers} blocks")
    head_params = vocab * shape.dim  # the output head (matmul_params includes it)
    block_params = (matmul_params - head_params) / shape.n_layers
    attention_per_block = attention_flops_per_token(1, shape.dim, cfg.data.seq_len)  # 12 D T, fwd + bwd
    kernels = traffic_kernels(cfg, dims, vocab, code)
    per_rank_tokens = cfg.train.global_batch_size * cfg.data.seq_len / (dims.dp * dims.tp)
    loads = []
    for r in range(dims.pp):
        stages = stage_ids(r, dims.pp, chunks)
        blocks = sum(layers[s] for s in stages)
        head = 1.0 if n_stages - 1 in stages else 0.0
        work = rank_work(cfg, dims, blocks, 1.0 if 0 in stages else 0.0, head)
        # 6 FLOPs per parameter and token (forward 2, backward 4); a recomputed block's forward 2 more
        runs = 3 * blocks + work.recomputed_blocks  # forward-equivalents of the rank's blocks
        matmul = 2 * runs * block_params + 6 * head * head_params
        attn = runs / 3 * attention_per_block  # the attention term scales as the blocks' FLOPs do
        scores = 0.0
        if code.attention != "fused":  # plain batched matrix products, at their roofline (products_seconds)
            attn, scores = 0.0, attn
        loads.append(
            estimate.StageLoad(
                matmul_flops=matmul * per_rank_tokens,
                attention_flops=attn * per_rank_tokens,
                memory_bytes=traffic.step_bytes(kernels, work),
                score_flops=scores * per_rank_tokens,
                score_bytes=traffic.score_product_bytes(kernels, work),
            )
        )
    return tuple(loads)


def analytic_model(cfg: Config, vocab: int, code: Code = Code()) -> analytic.Model:
    """The closed-form model of `cfg` (activations' and FSDP's gathered parameters' element sizes), with the
    element sizes and pipeline sends of what `code` runs (16-bit weights: 16-bit activations, and gradients
    unless reduced from fp32 copies)."""
    bf16 = cfg.parallel.param_dtype == "bf16"
    sixteen = code.weights_16bit
    return analytic.Model(
        configured_shape(cfg.model),
        vocab,
        cfg.data.seq_len,
        compute_bytes(cfg),
        2 if bf16 else 4,
        residual_bytes=2 if sixteen else 4,
        grad_bytes=2 if sixteen and not code.fp32_gradients else 4,
        pipeline_sends=code.pipeline_sends,
        gather_after_step=code.optimizer in estimate.PARTITIONED_OPTIMIZERS,
    )


def step_shape(cfg: Config, dims: ParallelDims) -> analytic.StepShape:
    """How one step of `cfg` splits its batch (for the closed-form collectives)."""
    p, t = cfg.parallel, cfg.train
    micro = dims.microbatches(p) if dims.pp_enabled else 1
    return analytic.StepShape(
        accumulation=accumulation(cfg, dims),
        microbatches=micro,
        batch=t.micro_batch_size // micro,
        chunks=p.pp_stages_per_rank if dims.pp_enabled else 1,
        sequence_parallel=p.sequence_parallel,
        loss_parallel=p.loss_parallel,
        recompute=p.activation_checkpoint != "none",
    )


def compute_bytes(cfg: Config) -> int:
    """Element size of activations: bf16 unless the run asks for fp32 everywhere (auto = bf16 on GPUs)."""
    return 4 if cfg.train.precision == "fp32" and cfg.parallel.param_dtype == "fp32" else 2
