"""exatrain: PyTorch training from one CPU to thousands of GPUs on SLURM clusters, wired right by default.

The public API for your own training loop (docs/api.md)::

    import exatrain
    with exatrain.init() as ctx:
        model = exatrain.parallelize(model, ctx)
        loader = exatrain.DataLoader(dataset, ctx, batch_size=64)
        ckpt = exatrain.Checkpointer("runs/me", ctx, model=model, optimizer=opt, loader=loader)
        ...

Names are imported lazily (PEP 562): `import exatrain` stays cheap (no torch) until one is used.
"""

from __future__ import annotations

from exatrain._lazy import lazy_exports

__version__ = "0.1.0"

#: public name -> the module (in its layer) that defines it
_EXPORTS = {
    "init": "exatrain.distributed.context",
    "init_deepspeed": "exatrain.engines.deepspeed.setup",
    "Context": "exatrain.distributed.context",
    "parallelize": "exatrain.distributed.wrap",
    "full_state_dict": "exatrain.distributed.state_dict",
    "print0": "exatrain.distributed.collectives",
    "save0": "exatrain.distributed.collectives",
    "mean_across_ranks": "exatrain.distributed.collectives",
    "sum_across_ranks": "exatrain.distributed.collectives",
    "all_gather_objects": "exatrain.distributed.collectives",
    "barrier": "exatrain.distributed.collectives",
    "seed_everything": "exatrain.distributed.seed",
    "ParallelDims": "exatrain.distributed.parallel_dims",
    "clip_grad_norm_": "exatrain.distributed.grad_norm",
    "load_full_state_dict": "exatrain.distributed.state_dict",
    "Pipeline": "exatrain.distributed.pipeline",
    "init_horovod": "exatrain.engines.horovod.setup",
    "attach_deepspeed": "exatrain.engines.deepspeed.setup",
    "DataLoader": "exatrain.data.loader",
    "GlobalBatchSampler": "exatrain.data.sampler",
    "Checkpointer": "exatrain.checkpoint.checkpointer",
    "load_model_file": "exatrain.checkpoint.export",
    "MetricsLog": "exatrain.observe.metrics",
    "Progress": "exatrain.observe.progress",
    "StepMetrics": "exatrain.observe.step_metrics",
    "step": "exatrain.observe.heartbeat",
    "backward": "exatrain.observe.backward_wait",
    "watch_hangs": "exatrain.observe.hang",
    "ExatrainError": "exatrain.errors",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
