"""The reliability scenarios' figures: what each scenario measured, recorded
as it runs, written to ``figures.json`` in the run's log folder (and to
``$TASKHOOK_RELIABILITY_FIGURES`` when set), and printed at the run's end.

On several pytest-xdist workers the scenarios run on one of them
(tests/conftest.py), whose summary nobody sees: that worker hands its
figures to the main process (:data:`WORKER_OUTPUT`), which prints them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

#: The key a worker's figures travel under (pytest-xdist's ``workeroutput``).
WORKER_OUTPUT = "reliability_figures"
_SHOWN = pytest.StashKey[dict]()


def received(config: pytest.Config) -> dict:
    """The figures this process prints at the end: ``{"folder": ...,
    "scenarios": {scenario: {name: value}}}``, its own or its workers'."""
    return config.stash.setdefault(_SHOWN, {"folder": None, "scenarios": {}})


class Figures:
    """What each scenario measured, by scenario."""

    def __init__(self, folder: Path, config: pytest.Config) -> None:
        self.folder = folder
        shown = received(config)
        shown["folder"] = str(folder)
        self.by_scenario: dict[str, dict] = shown["scenarios"]

    def record(self, scenario: str, **values: object) -> None:
        self.by_scenario.setdefault(scenario, {}).update(values)
        self.write()

    def write(self) -> None:
        text = self.text()
        (self.folder / "figures.json").write_text(text)
        if target := os.environ.get("TASKHOOK_RELIABILITY_FIGURES"):
            Path(target).write_text(text)

    def text(self) -> str:
        return json.dumps(self.by_scenario, indent=2, sort_keys=True, default=str)


def hand_over(config: pytest.Config) -> None:
    """On a pytest-xdist worker, give the main process this worker's figures."""
    shown = received(config)
    if hasattr(config, "workeroutput") and shown["scenarios"]:
        config.workeroutput[WORKER_OUTPUT] = json.dumps(shown, default=str)


def take_over(config: pytest.Config, text: str | None) -> None:
    """In the main process, what a worker handed over (:func:`hand_over`)."""
    if text:
        handed = json.loads(text)
        shown = received(config)
        shown["folder"] = handed["folder"]
        shown["scenarios"].update(handed["scenarios"])


def summarize(terminalreporter, config: pytest.Config) -> None:
    """The figures, as a section of the run's summary."""
    shown = received(config)
    if not shown["scenarios"]:
        return
    terminalreporter.section("reliability figures")
    for scenario, values in sorted(shown["scenarios"].items()):
        terminalreporter.write_line(f"{scenario}:")
        for name, value in values.items():
            terminalreporter.write_line(f"    {name}: {value}")
    terminalreporter.write_line(f"(also in {Path(shown['folder']) / 'figures.json'})")
