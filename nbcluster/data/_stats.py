"""Per-operator statistics of an execution: live snapshots and the ``stats()`` text."""

from __future__ import annotations

import dataclasses

__all__ = ["ExecutionStats", "OpSnapshot", "format_bytes", "format_count"]


def format_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_count(n: float) -> str:
    """``1234567`` -> ``'1.23M'``."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}" if float(n).is_integer() else f"{n:.3g}"


@dataclasses.dataclass
class OpSnapshot:
    """One operator at one moment (what the progress display and the plan graph show)."""

    name: str
    kind: str
    rows_out: int = 0
    blocks_out: int = 0
    bytes_out: int = 0
    tasks_running: int = 0
    tasks_done: int = 0
    queued_blocks: int = 0
    queued_bytes: int = 0
    usage_bytes: int = 0
    peak_usage_bytes: int = 0
    budget_bytes: int = 0
    held: str = ""
    actors: int = 0
    done: bool = False
    elapsed_s: float = 0.0
    task_time_s: float = 0.0
    total_rows: int | None = None

    @property
    def rows_per_s(self) -> float:
        """Output rows per second since the operator started."""
        return self.rows_out / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def line(self) -> str:
        """One line of text: ``name: rows, blocks, in flight, rows/s [held by ...]``."""
        parts = [
            f"{format_count(self.rows_out)} rows",
            f"{self.blocks_out} blocks",
            f"{format_bytes(self.usage_bytes)} in flight",
            f"{format_count(self.rows_per_s)} rows/s",
        ]
        if self.tasks_running:
            parts.append(f"{self.tasks_running} running")
        if self.actors:
            parts.append(f"{self.actors} actors")
        state = "done" if self.done else (f"held: {self.held}" if self.held else "")
        return f"{self.name}: " + ", ".join(parts) + (f" [{state}]" if state else "")


@dataclasses.dataclass
class ExecutionStats:
    """Statistics of one finished (or stopped) execution."""

    ops: list[OpSnapshot]
    wall_time_s: float
    budget_bytes: int
    peak_bytes_in_flight: int
    spilled_bytes: int = 0
    driver_rss_start: int = 0
    driver_rss_peak: int = 0
    status: str = "finished"

    def to_string(self) -> str:
        """The text ``Dataset.stats()`` returns."""
        lines = []
        for i, op in enumerate(self.ops):
            lines.append(
                f"Operator {i} {op.name}: {op.tasks_done} tasks executed, {op.blocks_out} blocks "
                f"produced in {self.wall_time_s:.2f}s"
            )
            per_block = op.rows_out / op.blocks_out if op.blocks_out else 0
            lines.append(f"* Output rows: {op.rows_out} ({per_block:.0f} per block)")
            lines.append(f"* Output size: {format_bytes(op.bytes_out)}")
            lines.append(f"* Remote task time: {op.task_time_s:.3f}s in total")
            lines.append(f"* Throughput: {format_count(op.rows_per_s)} rows/s")
            lines.append(
                f"* Peak bytes in flight: {format_bytes(op.peak_usage_bytes)} (operator budget "
                f"{format_bytes(op.budget_bytes)})"
            )
            lines.append("")
        lines.append(f"Execution: {self.status} in {self.wall_time_s:.2f}s")
        lines.append(
            f"* Object store budget: {format_bytes(self.budget_bytes)}; peak bytes in flight: "
            f"{format_bytes(self.peak_bytes_in_flight)}"
        )
        lines.append(f"* Spilled to disk during the execution: {format_bytes(self.spilled_bytes)}")
        if self.driver_rss_peak:
            lines.append(
                f"* Driver memory (RSS): {format_bytes(self.driver_rss_start)} at start, "
                f"{format_bytes(self.driver_rss_peak)} at peak"
            )
        return "\n".join(lines)
