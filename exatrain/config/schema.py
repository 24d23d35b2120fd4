"""Typed configuration: one frozen dataclass per concern, every field documented.

The `help` metadata of each field is the single source of the configuration reference
(`exatrain config --reference` prints it; README.md embeds it and a test keeps the two equal).
"""

from __future__ import annotations

from dataclasses import dataclass, field


def doc(default, help: str):
    """A dataclass field with a default and its user-facing documentation."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class RunConfig:
    """Where a run writes its outputs."""

    dir: str = doc(
        "runs/default", "Run directory: metrics.jsonl, summary.json, model files, per-rank reports."
    )
    hang_timeout_s: float = doc(
        -1.0,
        "Declare a rank hung after this many seconds without progress: every rank's "
        "stacks and a diagnosis go to RUN_DIR/hang/ and the job stops with exit code "
        "76 (restarted from the last checkpoint with --max-restarts); 0 = off; -1 = "
        "derived from the first steps: max(10 x the median step, 300 s, the first "
        "step). Else at least 2, above the longest step, evaluation and checkpoint "
        "(docs/hangs.md).",
    )


@dataclass(frozen=True)
class ModelConfig:
    """The reference decoder-only Transformer language model."""

    size: str = doc("tiny", "Named size: tiny, small, medium, large, xl (about 1B parameters).")
    dropout: float = doc(0.0, "Dropout probability (0 keeps runs bit-reproducible).")
    n_layers: int = doc(0, "Override the named size's number of blocks (0 = the size's own depth).")
    dim: int = doc(0, "Override the named size's model width (0 = the size's own).")
    n_heads: int = doc(
        0, "Override the named size's attention heads; they must divide the width (0 = the size's own)."
    )


@dataclass(frozen=True)
class DataConfig:
    """Training data: corpus kind, location, tokenised cache and window length."""

    kind: str = doc(
        "synthetic",
        "Corpus: synthetic (generated, no files), wikitext (WikiText-2 format dir), text (dir of raw text).",
    )
    path: str = doc("", "Directory of the corpus (wikitext, text). Unused for synthetic.")
    cache_dir: str = doc(
        "", "Where tokenised arrays are cached (memory-mapped); empty = RUN_DIR/../.cache/data."
    )
    seq_len: int = doc(64, "Tokens per training window (the model's context length).")
    seed: int = doc(1234, "Seed of the synthetic corpus generator.")
    max_vocab: int = doc(0, "Keep only the most frequent words of raw text corpora (0 = all).")
    train_split: str = doc("train", "Split to train on (train, valid or test).")
    eval_split: str = doc("valid", "Split to evaluate on (train, valid or test).")


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation loop."""

    steps: int = doc(300, "Optimizer steps.")
    global_batch_size: int = doc(32, "Samples per optimizer step summed over all ranks.")
    micro_batch_size: int = doc(
        16, "Samples per rank per forward pass; accumulation = global / (micro x world size)."
    )
    lr: float = doc(3e-3, "Peak learning rate of AdamW.")
    min_lr_ratio: float = doc(0.1, "Cosine decay ends at lr x min_lr_ratio.")
    warmup_steps: int = doc(30, "Linear warmup steps before the cosine decay.")
    weight_decay: float = doc(0.1, "AdamW weight decay (matrices only; norms and biases are not decayed).")
    beta1: float = doc(0.9, "AdamW beta1.")
    beta2: float = doc(0.95, "AdamW beta2.")
    grad_clip: float = doc(1.0, "Clip the global gradient norm to this value (0 = off).")
    seed: int = doc(0, "Seed of model initialisation and data order (ranks add their rank for dropout).")
    eval_every: int = doc(100, "Evaluate every N steps (0 = only at the end).")
    eval_batches: int = doc(16, "Batches per evaluation, split across ranks (0 = the whole split).")
    eval_at_start: bool = doc(True, "Evaluate the untrained model once before step 1.")
    log_every: int = doc(10, "Print and record a progress line every N steps.")
    precision: str = doc("auto", "Autocast: auto (bf16 on GPU, fp32 on CPU), bf16, fp32.")
    device: str = doc("auto", "auto (the local rank's GPU if any, else CPU), cuda or cpu.")
    save_model: bool = doc(True, "Rank 0 saves best.pt (lowest eval loss) and final.pt as plain state dicts.")


@dataclass(frozen=True)
class DistConfig:
    """Process group set-up."""

    backend: str = doc("auto", "auto (nccl on CUDA/ROCm, gloo on CPU), nccl or gloo.")
    timeout_s: float = doc(300.0, "Seconds to wait for all ranks to join and for each collective.")
    master_port: int = doc(
        0, "Rendezvous port; 0 = MASTER_PORT or a port derived from the SLURM job and step id."
    )
    master_suffix: str = doc("", "Appended to the master hostname (JSC: 'i' selects the InfiniBand address).")
    resolve_master: bool = doc(False, "Resolve the master hostname to an IP address before joining.")
    affinity: str = doc(
        "warn",
        "Compare each rank's CPU affinity with the cores expected for it (the profile's "
        "mask of its GPU or local rank, else its GPU's NUMA node): warn, strict (fail on a "
        "mismatch) or off.",
    )

    def env_options(self) -> dict:
        """Keyword arguments of `exatrain.env.detect_environment` that this section sets."""
        return {
            "master_suffix": self.master_suffix,
            "resolve_master": self.resolve_master,
            "master_port": self.master_port or None,
        }


@dataclass(frozen=True)
class ParallelConfig:
    """How ranks split the work: data parallel (replicate / shard), tensor and pipeline parallel.

    The four degrees multiply to the world size; one of them may be -1 (inferred). dp_shard > 1 is FSDP,
    dp_replicate > 1 alone is DDP, both > 1 is HSDP.
    """

    dp_replicate: int = doc(
        -1, "Data-parallel replicas: DDP, or HSDP's replicate dimension when dp_shard > 1 (-1 = infer)."
    )
    dp_shard: int = doc(
        1, "FSDP shard degree: parameters, gradients and optimizer state split this many ways (1 = off)."
    )
    tp: int = doc(
        1, "Tensor-parallel degree: splits attention heads and MLP width (must divide the head count)."
    )
    pp: int = doc(1, "Pipeline-parallel degree: splits the blocks into consecutive stages.")
    sequence_parallel: bool = doc(
        False, "With tp > 1: shard norms and residual activations along the sequence."
    )
    loss_parallel: bool = doc(
        False, "With tp > 1: cross-entropy on vocabulary-sharded logits, never gathering them."
    )
    pp_schedule: str = doc("1f1b", "Pipeline schedule: gpipe, 1f1b or interleaved_1f1b.")
    pp_stages_per_rank: int = doc(
        1, "Model chunks per pipeline rank: 1 for gpipe and 1f1b, at least 2 for interleaved_1f1b."
    )
    pp_microbatches: int = doc(
        0,
        "Pipeline microbatches per micro-batch (0 = the number of stages); must divide "
        "train.micro_batch_size.",
    )
    fsdp_reshard_after_forward: bool = doc(
        True, "FSDP frees gathered parameters after forward (saves memory, gathers again in backward)."
    )
    param_dtype: str = doc(
        "fp32",
        "FSDP mixed precision: bf16 computes with bf16 parameters and reduces gradients in fp32; fp32 = off.",
    )
    cpu_offload: bool = doc(
        False, "FSDP keeps parameters, gradients and optimizer state in CPU memory between uses."
    )
    activation_checkpoint: str = doc(
        "none", "Recompute activations in backward: none, full (every block) or every (every k-th block)."
    )
    activation_checkpoint_every: int = doc(
        2, "With activation_checkpoint=every: checkpoint every k-th block."
    )
    compile: bool = doc(False, "torch.compile each block.")
    compile_backend: str = doc(
        "inductor", "torch.compile backend (inductor; aot_eager compiles fast for smoke tests)."
    )


@dataclass(frozen=True)
class EngineConfig:
    """Which library runs the data-parallel step: torch's own (DDP/FSDP/TP/PP by [parallel]), DeepSpeed ZeRO
    or Horovod. DeepSpeed and Horovod take batch sizes, accumulation, clipping and precision from [train]."""

    name: str = doc(
        "torch",
        "torch (layouts of [parallel]), deepspeed (ZeRO, needs the deepspeed extra) or horovod "
        "(needs scripts/install.sh horovod).",
    )
    zero_stage: int = doc(
        1, "deepspeed: ZeRO stage 1 (optimizer state sharded), 2 (+ gradients) or 3 (+ parameters)."
    )
    deepspeed_config: str = doc(
        "",
        "deepspeed: a DeepSpeed JSON file merged into the generated config (its keys win, "
        "except those that contradict [train] or zero_stage: an error names them).",
    )


@dataclass(frozen=True)
class CheckpointConfig:
    """Sharded checkpoints of the whole training state (RUN_DIR/checkpoints/step-N)."""

    interval: int = doc(0, "Save every N steps and after the last step (0 = no checkpoints).")
    keep: int = doc(
        3, "Keep the newest K complete checkpoints (0 = keep all); the one resumed from is never deleted."
    )
    resume: str = doc(
        "",
        "Resume from: 'auto' (latest complete checkpoint, if any), a step-N path, or '' (start fresh; "
        "'auto' after a torchrun or SLURM restart).",
    )
    init_from: str = doc(
        "", "Seed the model weights from a plain state dict file (e.g. from `exatrain checkpoint export`)."
    )
    async_save: bool = doc(
        False, "Write periodic checkpoints in a background thread while training continues (one at a time)."
    )
    signals: str = doc(
        "USR2,TERM",
        "Signals that mean 'time is up': finish the step, checkpoint, requeue (SLURM) and exit; '' = none.",
    )


@dataclass(frozen=True)
class ObserveConfig:
    """Where metrics go besides metrics.jsonl and the progress output."""

    tensorboard: str = doc(
        "auto",
        "TensorBoard event files in RUN_DIR/tensorboard (rank 0): auto (when the tensorboard "
        "package is installed), on or off.",
    )
    monitor_interval_s: float = doc(
        10.0,
        "Sample every GPU of each node (local rank 0) this often into "
        "RUN_DIR/monitor/HOST.jsonl, summarised at the end; 0 = off.",
    )
    straggler_ratio: float = doc(
        1.2,
        "A rank whose own time in a phase (data, checkpoint, or forward_backward less its wait for the "
        "other ranks) makes every step this many times longer than without it is a straggler: "
        "named in the progress line, and flagged once (host, GPU) after straggler_intervals log intervals "
        "in a row; > 1.",
    )
    straggler_intervals: int = doc(3, "Log intervals in a row a straggler must persist to be flagged; >= 1.")


@dataclass(frozen=True)
class ProfilerConfig:
    """torch.profiler traces of chosen ranks and steps (RUN_DIR/profile/); off unless `ranks` is set."""

    ranks: str = doc(
        "",
        "Ranks to profile: a list like '0,last' or '0,3,5', 'every:K' (every K-th rank), 'all'; "
        "empty = profiling off.",
    )
    steps: str = doc(
        "3-4", "Optimizer steps to record, 'A-B' or 'A' (1-based, inclusive); earlier steps warm up."
    )
    memory_snapshot: bool = doc(
        False,
        "Also record a CUDA memory snapshot (pickle for pytorch.org/memory_viz) of the "
        "same steps on the profiled ranks (GPU only).",
    )


@dataclass(frozen=True)
class JobConfig:
    """SLURM job for `exatrain sbatch`, `cost` and `submit`: resources, site profile, container, \
launch mode."""

    nodes: int = doc(1, "Nodes to allocate (>= 1).")
    gpus_per_node: int = doc(
        0, "GPUs (ranks) per node; 0 = all of the profile's GPUs. CPU profile: ranks per node."
    )
    cpus_per_task: int = doc(
        0,
        "CPU cores per rank (one rank per GPU); 0 = the profile's default. torchrun mode "
        "asks for this times the ranks per node for its one task per node.",
    )
    mem_per_gpu_gb: int = doc(
        0, "Memory per GPU in GB (--mem-per-gpu); 0 = the profile's default (may be none)."
    )
    time: str | int = doc(
        "00:30:00",
        "Time limit in any sbatch form: minutes (90), MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS.",
    )
    partition: str = doc("", "SLURM partition; empty = the profile's default partition.")
    account: str = doc("", "Project/account to charge (LUMI: project_465000123); empty = none given.")
    reservation: str = doc("", "SLURM reservation; empty = none.")
    qos: str = doc("", "Quality of service; empty = none.")
    name: str = doc("exatrain", "Job name (%x in output patterns).")
    output: str = doc(
        "%x-%j.out",
        "stdout file pattern (%x = job name, %j = job id, %a = array task); "
        "relative to the run directory's parent.",
    )
    error: str = doc("", "stderr file pattern; empty = together with stdout.")
    extra_sbatch: tuple[str, ...] = doc(
        (),
        'Extra sbatch flags written verbatim as #SBATCH lines, e.g. ["--exclusive"]; '
        "flags exatrain writes itself (or that contradict them, like --mem) are refused.",
    )
    env: tuple[tuple[str, str], ...] = doc(
        (), 'Extra environment: a [job.env] table of NAME = "value"; wins over the profile\'s presets.'
    )
    container_image: str = doc("", "Singularity/Apptainer image to run the ranks in; empty = no container.")
    container_binds: tuple[str, ...] = doc((), "Extra --bind paths for the container (src[:dst[:opts]]).")
    container_venv: str = doc(
        "",
        "A venv created through the image (`exatrain container venv IMAGE PATH`) that the "
        "ranks activate inside it; it holds exatrain. Empty = the image's own Python.",
    )
    container_start: str = doc(
        "exec", "How the image starts the ranks: exec, or run (its runscript; LUMI AI Factory images)."
    )
    launch: str = doc(
        "srun",
        "srun = one task per GPU started by srun; torchrun = one task per node running "
        "torchrun with c10d rendezvous on the first node.",
    )
    profile: str = doc(
        "generic-nvidia",
        "Site profile: a bundled name (lumi-g, juwels-booster, jureca-dc, "
        "generic-nvidia, generic-amd, cpu) or the path of a profile TOML file.",
    )
    command: tuple[str, ...] = doc(
        ("exatrain", "train"),
        "What each rank runs; exatrain's trainer also gets the "
        "run directory and this configuration; in srun mode a "
        "Python script (python train.py ...) runs under `exatrain "
        "run`, which sets torchrun's variables.",
    )
    label: bool = doc(
        False,
        "Begin each line a Python script's ranks print with [rank N], as `exatrain run --label` does "
        "(srun mode: the script runs under `exatrain run --label`; torchrun mode: under the script runner's "
        "--label). Only for a job.command that is a Python script (python train.py or python -m pkg).",
    )
    signal: str = doc(
        "USR2@120",
        "Signal sent this many seconds before the time limit (checkpointing); empty = "
        "none. It reaches every rank and must be one of checkpoint.signals; the lead time "
        "must lie inside job.time (B: is refused: nothing forwards it).",
    )
    hang_requeues: int = doc(
        0,
        "When the ranks stop on a hang (exit code 76, docs/hangs.md): requeue the job at most this many "
        "times, without the node(s) the diagnosis blames; 0 = the job ends with code 76.",
    )


@dataclass(frozen=True)
class Config:
    """The whole configuration: one section per concern."""

    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    observe: ObserveConfig = field(default_factory=ObserveConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    job: JobConfig = field(default_factory=JobConfig)
