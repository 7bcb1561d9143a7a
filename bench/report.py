"""Results: ``bench/results/<name>.json`` and a PNG chart beside it."""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def median(values: list[float]) -> float:
    return round(statistics.median(values), 1) if values else 0.0


def ratio(numerator: float, denominator: float) -> float:
    return round(numerator / denominator, 3) if denominator else 0.0


def write(folder: Path, name: str, result: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": name,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"python": platform.python_version(), "cpus": _cpus()},
        **result,
    }
    path = folder / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


def chart(
    folder: Path,
    name: str,
    title: str,
    rows: list[dict[str, Any]],
    *,
    rate_label: str = "throughput (per s)",
) -> Path:
    """Two panels: the rate of each configuration, and its latency percentiles.

    ``rows``: ``{"label", "rate", optional "low"/"high" (the spread over
    repeats), optional "p50_ms"/"p95_ms"/"p99_ms"}``.
    """
    labels = [row["label"] for row in rows]
    with_latency = [row for row in rows if row.get("p99_ms") is not None]
    figure, axes = plt.subplots(
        1, 2 if with_latency else 1, figsize=(13 if with_latency else 7, 4.8), squeeze=False
    )
    left = axes[0][0]
    rates = [row["rate"] for row in rows]
    errors = [
        [row["rate"] - row.get("low", row["rate"]) for row in rows],
        [row.get("high", row["rate"]) - row["rate"] for row in rows],
    ]
    bars = left.bar(range(len(rows)), rates, yerr=errors, capsize=3, color="#4C72B0")
    left.bar_label(bars, labels=[f"{rate:,.0f}" for rate in rates], fontsize=8)
    left.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=8)
    left.set_ylabel(rate_label)
    left.set_title(title, fontsize=10)
    if with_latency:
        right = axes[0][1]
        width = 0.27
        positions = range(len(with_latency))
        for offset, key, color in (
            (-1, "p50_ms", "#55A868"),
            (0, "p95_ms", "#DD8452"),
            (1, "p99_ms", "#C44E52"),
        ):
            right.bar(
                [p + offset * width for p in positions],
                [row.get(key) or 0 for row in with_latency],
                width,
                label=key.replace("_ms", ""),
                color=color,
            )
        right.set_xticks(
            list(positions),
            [row["label"] for row in with_latency],
            rotation=30,
            ha="right",
            fontsize=8,
        )
        right.set_ylabel("latency (ms)")
        right.set_yscale("log")
        right.legend(fontsize=8)
        right.set_title("latency percentiles", fontsize=10)
    figure.tight_layout()
    path = folder / f"{name}.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
