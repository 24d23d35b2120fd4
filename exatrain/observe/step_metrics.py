"""Per-step training metrics without per-step host-device syncs (the `exatrain.StepMetrics` object).

Between log steps nothing leaves the device and nothing crosses ranks: the loss is summed into a device
tensor, phase times are host clocks (data wait, checkpoint stall) or CUDA events (forward+backward,
optimizer: the host would only see kernel launches), token counts are Python numbers. On a log step ONE
all_gather of a small vector per rank (followed by one `.tolist()`) yields the global mean loss, global
tokens/s and samples/s, the mean step-time breakdown, MFU, peak device memory, the spread between the
slowest and the fastest rank, and the straggler: the rank whose own time in a phase exceeds the median
rank's the most. A rank's own forward/backward time is that phase less the time its backward waited for
the other ranks' gradients (`observe.backward_wait`, measured where the backward runs inside
`exatrain.backward(loss)`, as the reference trainer's engines do).

Usage in your own loop::

    metrics = exatrain.StepMetrics(log_every=10, device=ctx.device, flops_per_token=fpt)
    for step in range(1, steps + 1):
        with metrics.phase("data"):
            x, y = next(batches)
        with metrics.phase("forward_backward"):
            loss = model(x, y); exatrain.backward(loss)   # loss.backward(), its wait for the others timed
        with metrics.phase("optimizer"):
            opt.step(); opt.zero_grad()
        metrics.add_loss(loss)
        record = metrics.end_step(tokens=y.numel(), samples=len(y))   # a dict on log steps, else None
        if record: log.write(**record)
"""

from __future__ import annotations

import contextlib
import socket
import time

import torch
import torch.distributed as dist

from exatrain.env.affinity import physical_gpu
from exatrain.observe import backward_wait, heartbeat
from exatrain.observe.flops import device_peak_flops
from exatrain.observe.progress import STRAGGLER_RATIO

#: a rank above `straggler_ratio` for this many log intervals in a row is flagged (once)
STRAGGLER_INTERVALS = 3

#: the phases of a step, in the order records list them; host phases are waits measured with the host clock
PHASES = ("data", "forward_backward", "optimizer", "checkpoint")
HOST_PHASES = frozenset({"data", "checkpoint"})
# per-rank vector gathered on log steps: loss sum, loss count, tokens, samples, busy seconds, peak bytes,
# window seconds, then one entry per phase (seconds), then backward's tail wait (seconds, passes timed)
_FIXED = 7
_WAIT = _FIXED + len(PHASES)


class StepMetrics:
    """Accumulates one rank's step metrics and reduces them across ranks every `log_every` steps.

    `end_step()` is called by every rank after each optimizer step; on log steps (every `log_every`-th
    and `last_step`) it is a collective and returns the same record on every rank, else None.
    `flops_per_token`: training FLOPs per token (forward + backward) for MFU; `peak_flops`: the device's
    peak (default: looked up from the GPU's name; none on CPU, so no MFU there). `group`: the ranks to
    reduce over (default: all). `start_step`: optimizer steps done before (a resumed run).
    `straggler_ratio`, `straggler_intervals`: a rank that slows every step by that factor or more (the
    record's straggler_ratio) for that many log intervals in a row is flagged once, with its host and GPU,
    in the record's `straggler_flagged` (None on other records).
    """

    def __init__(
        self,
        log_every: int = 10,
        device=None,
        flops_per_token: float | None = None,
        peak_flops: float | None = None,
        last_step: int | None = None,
        group=None,
        start_step: int = 0,
        straggler_ratio: float = STRAGGLER_RATIO,
        straggler_intervals: int = STRAGGLER_INTERVALS,
    ):
        if log_every < 1:
            raise ValueError(f"log_every={log_every}: must be >= 1")
        self.log_every, self.last_step, self.group = log_every, last_step, group
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops if peak_flops is not None else device_peak_flops(self.device)
        self._events = self.device.type == "cuda"
        self.step = start_step  # steps already done (a resumed run continues the count)
        self.straggler_ratio, self.straggler_intervals = straggler_ratio, max(1, straggler_intervals)
        self._streak: tuple[int | None, int] = (None, 0)  # (rank above the ratio, log intervals in a row)
        self._flagged: set[int] = set()
        self._places: list | None = None  # every rank's (host, device), gathered at the first flag
        self._reset_window(time.perf_counter())

    def _reset_window(self, now: float) -> None:
        self._window_start, self._window_steps = now, 0
        self._loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self._loss_count = 0
        self._tokens = self._samples = 0.0
        self._host = dict.fromkeys(PHASES, 0.0)
        self._pending: list[tuple[str, object, object]] = []  # (phase, start event, end event) on CUDA

    @contextlib.contextmanager
    def phase(self, name: str):
        """Time the block as phase `name` (data, forward_backward, optimizer, checkpoint) of this step."""
        if name not in PHASES:
            raise ValueError(f"phase {name!r}: expected one of {', '.join(PHASES)}")
        heartbeat.mark(name)  # what the hang watcher reports as this rank's phase
        if self._events and name not in HOST_PHASES:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self._pending.append((name, start, end))
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._host[name] += time.perf_counter() - t0

    @contextlib.contextmanager
    def paused(self):
        """Leave the block's time out of the window's wall time (e.g. an evaluation between steps)."""
        heartbeat.mark("paused")
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._window_start += time.perf_counter() - t0

    def add_time(self, name: str, seconds: float) -> None:
        """Add host-measured seconds to phase `name` (for a phase timed elsewhere)."""
        self._host[name] += seconds

    def add_loss(self, loss: torch.Tensor | float) -> None:
        """Add this step's loss (a tensor stays on its device: no sync). Call once per optimizer step."""
        if isinstance(loss, torch.Tensor):
            self._loss_sum += loss.detach().to(self._loss_sum.device, torch.float64)
        else:
            self._loss_sum += float(loss)
        self._loss_count += 1

    def is_log_step(self, step: int) -> bool:
        """Whether `end_step` of step `step` (1-based) reduces and returns a record."""
        return step % self.log_every == 0 or (self.last_step is not None and step == self.last_step)

    def end_step(self, tokens: float = 0, samples: float = 0) -> dict | None:
        """Close one optimizer step that processed `tokens`/`samples` on THIS rank (host numbers).

        Returns the record (same on every rank) on log steps, else None; no device sync on other steps."""
        self.step += 1
        self._window_steps += 1
        self._tokens += tokens
        self._samples += samples
        if not self.is_log_step(self.step):
            return None
        return self._reduce()

    def _reduce(self) -> dict:
        local = self._local_vector()
        rows = _gather(local, self.group)  # the one collective (and, with .tolist(), the one sync)
        record = self._record(rows)
        self._reset_window(time.perf_counter())
        return record

    def _local_vector(self) -> torch.Tensor:
        phases = dict(self._host)
        if self._pending:
            self._pending[-1][2].synchronize()  # log steps only: the last event done means all are
            for name, start, end in self._pending:
                phases[name] += start.elapsed_time(end) / 1000.0
        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else -1.0
        window_s = time.perf_counter() - self._window_start
        host = [
            float(self._loss_count),
            self._tokens,
            self._samples,
            sum(phases.values()),
            float(peak),
            window_s,
        ]
        host += [phases[p] for p in PHASES]
        host += backward_wait.take()
        host_t = torch.tensor(host, dtype=torch.float64, device=self.device)
        return torch.cat([self._loss_sum.reshape(1), host_t])

    def _record(self, rows: list[list[float]]) -> dict:
        n, steps = len(rows), self._window_steps
        col = lambda i: [r[i] for r in rows]  # noqa: E731
        window_s = max(col(6))  # the slowest rank's wall time: the same record on every rank
        loss_n = sum(col(1))
        tokens, samples = sum(col(2)), sum(col(3))
        busy = [b / steps for b in col(4)]
        slowest = max(range(n), key=busy.__getitem__)
        peak = max(col(5))
        record = {
            "step": self.step,
            "loss": sum(col(0)) / loss_n if loss_n else None,
            "tokens_per_s": tokens / window_s if window_s > 0 else None,
            "samples_per_s": samples / window_s if window_s > 0 else None,
            "step_s": window_s / steps,
            **{f"time_{p}_s": sum(col(_FIXED + i)) / n / steps for i, p in enumerate(PHASES)},
            "mfu": self._mfu(tokens / window_s if window_s > 0 else 0.0, n),
            "peak_mem_gib": peak / 2**30 if peak >= 0 else None,
            "rank_skew_s": max(busy) - min(busy),
            "slowest_rank": _global_rank(slowest, self.group),
            **self._straggler(rows, window_s / steps),
        }
        record["straggler_flagged"] = self._flag(record)
        return record

    def _flag(self, record: dict) -> dict | None:
        """The straggler to flag on this record (see the class docstring), None if none. The same record on
        every rank, so every rank takes the one extra collective (host names) at the first flag together."""
        rank, slow = record["straggler_rank"], record["straggler_ratio"] >= self.straggler_ratio
        last, count = self._streak
        self._streak = (rank, count + 1 if rank == last else 1) if slow and rank is not None else (None, 0)
        rank, count = self._streak
        if rank is None or count < self.straggler_intervals or rank in self._flagged:
            return None
        self._flagged.add(rank)
        host, device = self._place(rank)
        return {
            "rank": rank,
            "host": host,
            "device": device,
            "phase": record["straggler_phase"],
            "ratio": record["straggler_ratio"],
            "intervals": count,
        }

    def _place(self, rank: int) -> tuple[str, str]:
        if self._places is None:
            mine = (socket.gethostname(), device_name(self.device))
            if dist.is_available() and dist.is_initialized():
                places = [None] * dist.get_world_size(self.group)
                dist.all_gather_object(places, mine, group=self.group)
                self._places = {_global_rank(i, self.group): p for i, p in enumerate(places)}
            else:
                self._places = {0: mine}
        return tuple(self._places.get(rank, ("?", "?")))

    def _straggler(self, rows: list[list[float]], step_s: float) -> dict:
        """The rank whose own time in a phase exceeds the median rank's (the lower median for an even count)
        the most, per step: `straggler_rank` (None when none does), `straggler_phase`, `straggler_excess_s`
        and `straggler_ratio` = step_s / (step_s - excess), how much longer the job's steps take than
        without that excess (every rank waits for it). Host phases (data, checkpoint) count as measured.
        forward_backward counts less backward's tail wait, and only when every rank timed its backward
        (`exatrain.backward`): the other ranks wait for a slow one inside the gradient all-reduce, so the
        raw phase is the slowest rank's on every rank. The optimizer phase is left out (its collectives,
        e.g. a sharded gradient norm, hide a slow rank the same way, untimed)."""
        best = (0.0, None, None)
        for phase, times in self._own_times(rows).items():
            median = sorted(times)[(len(times) - 1) // 2]
            rank = max(range(len(times)), key=times.__getitem__)
            best = max(best, (times[rank] - median, rank, phase), key=lambda b: b[0])
        excess, rank, phase = best
        if rank is None:
            return {
                "straggler_rank": None,
                "straggler_phase": None,
                "straggler_excess_s": 0.0,
                "straggler_ratio": 1.0,
            }
        return {
            "straggler_rank": _global_rank(rank, self.group),
            "straggler_phase": phase,
            "straggler_excess_s": excess,
            "straggler_ratio": step_s / max(step_s - excess, 1e-9),
        }

    def _own_times(self, rows: list[list[float]]) -> dict[str, list[float]]:
        """Per phase that can name a straggler: each rank's own seconds in it per step (see _straggler)."""
        steps = self._window_steps
        own = {p: [r[_FIXED + i] / steps for r in rows] for i, p in enumerate(PHASES) if p in HOST_PHASES}
        if all(r[_WAIT + 1] > 0 for r in rows):  # every rank timed its backward's wait
            i = _FIXED + PHASES.index("forward_backward")
            own["forward_backward"] = [(r[i] - r[_WAIT]) / steps for r in rows]
        return own

    def _mfu(self, tokens_per_s: float, ranks: int) -> float | None:
        if not self.flops_per_token or not self.peak_flops:
            return None
        return tokens_per_s * self.flops_per_token / (self.peak_flops * ranks)


def _gather(local: torch.Tensor, group) -> list[list[float]]:
    """Every rank's vector, as floats on the host (all_gather; one process without a group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [local.tolist()]
    rows = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(rows, local, group=group)
    return torch.stack(rows).tolist()


def device_name(device: torch.device) -> str:
    """'GPU 3' (the node's GPU behind this process's CUDA/ROCm device, after CUDA/HIP/ROCR_VISIBLE_DEVICES
    narrowed them: the number nvidia-smi and rocm-smi show) or 'CPU'."""
    if device.type != "cuda":
        return device.type.upper()
    return f"GPU {physical_gpu(device.index if device.index is not None else torch.cuda.current_device())}"


def _global_rank(group_rank: int, group) -> int:
    if group is None or not (dist.is_available() and dist.is_initialized()):
        return group_rank
    return dist.get_global_rank(group, group_rank)
