"""Hang diagnosis from the files the ranks' watchers left: which rank stalled, where, and who waits for it.

Pure functions over plain dicts (the JSON files of RUN_DIR/hang/attempt-K/), so the wording is tested
without a hang. The stall line is the innermost frame of the rank's main thread in the user's own code
(outside the standard library and installed packages); exatrain's own frames count only when nothing else
is there.
"""

from __future__ import annotations

from exatrain.launch.stacks import pyspy_frames, stall_frame, where

__all__ = ["culprit_ranks", "diagnose", "pyspy_frames", "stall_frame", "suspect_nodes", "where"]


def _ranks(ranks) -> str:
    return ",".join(str(r) for r in sorted(ranks))


def _collective(report: dict) -> dict | None:
    return report.get("collective") or None


def _waiting_and_behind(reports: dict[int, dict]) -> tuple[list[int], list[int], dict | None]:
    """From the flight recorder summaries: ranks inside a collective, ranks that never entered the newest
    one, and that newest collective (None without flight recorder data)."""
    known = {r: c for r, c in ((r, _collective(rep)) for r, rep in reports.items()) if c}
    if not known:
        return [], [], None
    newest = max(known.values(), key=lambda c: c["enqueued"])
    waiting = [r for r, c in known.items() if c["enqueued"] > c["completed"]]
    behind = [r for r, c in known.items() if c["enqueued"] < newest["enqueued"]]
    return waiting, behind, newest


def culprit_ranks(reports: dict[int, dict], stopped: dict[int, dict]) -> list[int]:
    """The ranks the hang is blamed on: stopped ones, then those that never entered the newest collective,
    else (no flight recorder data) the ones at the lowest step or with the longest stall."""
    _, behind, _ = _waiting_and_behind(reports)
    culprits = sorted(stopped) + [r for r in behind if r not in stopped]
    return culprits or _oldest(reports)


def suspect_nodes(reports: dict[int, dict], stopped: dict[int, dict]) -> list[str]:
    """The nodes of the culprit ranks, for a requeue that excludes them; none when they are every node heard
    from (a job that excluded all its nodes could never run again)."""
    heard = {**stopped, **reports}
    node = {r: rep.get("node") or rep.get("host") for r, rep in heard.items()}
    bad = {node[r] for r in culprit_ranks(reports, stopped) if node.get(r)}
    return sorted(bad) if bad and bad < set(node.values()) else []


def diagnose(reports: dict[int, dict], stopped: dict[int, dict], world_size: int, timeout_s: float) -> str:
    """One paragraph naming the stalled rank(s), their host, pid, step, phase and stall line, and what the
    others wait in. `reports`: rank -> its watcher's report; `stopped`: rank -> the last heartbeat of a rank
    whose watcher stopped writing (SIGSTOP, a process holding the GIL, a dead node)."""
    waiting, _, newest = _waiting_and_behind(reports)
    culprits = culprit_ranks(reports, stopped)
    parts = [_describe(r, reports.get(r) or stopped[r], r in stopped) for r in culprits]
    others = [r for r in waiting if r not in culprits]
    text = "; ".join(parts)
    if others and newest:
        text += (
            f"; rank(s) {_ranks(others)} wait in {newest['op']} #{newest['enqueued']}, which rank(s) "
            f"{_ranks(culprits)} never entered"
        )
    silent = set(range(world_size)) - set(reports) - set(stopped)
    if silent:
        text += f"; no report from rank(s) {_ranks(silent)}"
    return f"exatrain: HANG (no progress for over {timeout_s:g} s): {text}."


def _oldest(reports: dict[int, dict]) -> list[int]:
    """Without flight recorder data: the ranks at the lowest step, or failing that, the earliest stall."""
    if not reports:
        return []
    low = min(rep["step"] for rep in reports.values())
    at_low = [r for r, rep in reports.items() if rep["step"] == low]
    if len(at_low) < len(reports):
        return at_low
    return [max(reports, key=lambda r: reports[r]["stalled_s"])]


def _describe(rank: int, rep: dict, stopped: bool) -> str:
    gpu = f", {rep['device']}" if rep.get("device") else ""  # "GPU 3": the node's number, as nvidia-smi shows
    who = f"rank {rank} ({rep.get('host', '?')}{gpu}, pid {rep.get('pid', '?')})"
    at = f"step {rep['step']}" if rep["step"] or not rep.get("batches") else f"batch {rep['batches']}"
    place = rep.get("where") or "an unknown place"
    if stopped:
        return (
            f"{who} stopped beating {rep.get('silent_s', 0):.0f} s ago (a stopped process, e.g. "
            "SIGSTOP, or one "
            f"stuck holding Python's lock, whose last heartbeat file said {at}, phase "
            f"{rep['phase']}) and stands at "
            f"{place}"
        )
    text = f"{who} has made no progress for {rep['stalled_s']:.0f} s at {at} in phase {rep['phase']}"
    text += f" at {place}"
    own = _collective(rep)
    if own and own["enqueued"] > own["completed"]:  # e.g. a GPU still busy with the work queued before it
        text += f", with its {own['op']} #{own['enqueued']} queued and not completed"
    return text
