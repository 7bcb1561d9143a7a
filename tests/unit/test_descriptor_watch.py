"""The session's guard against leaked file descriptors (tests/support/descriptors.py):
it sees a descriptor left open, names the module that left it, and lets one
closed again pass."""

from __future__ import annotations

import gc
import os
import weakref

from tests.support.descriptors import DescriptorWatch, open_descriptors


def test_a_descriptor_left_open_is_too_many_and_its_module_is_named():
    gc.collect()  # what earlier tests' garbage holds is not this test's to count
    watch = DescriptorWatch(limit=0)
    before = open_descriptors()
    leaked = os.open(os.devnull, os.O_RDONLY)
    try:
        watch.module_ran("tests.unit.leaky", before)
        excess = watch.excess()
    finally:
        os.close(leaked)
    assert excess is not None
    assert "left 1 file descriptors open" in excess
    assert "+1  tests.unit.leaky" in excess


def test_descriptors_closed_again_are_within_the_limit():
    gc.collect()
    watch = DescriptorWatch(limit=0)
    before = open_descriptors()
    os.close(os.open(os.devnull, os.O_RDONLY))
    watch.module_ran("tests.unit.tidy", before)
    assert watch.excess() is None
    assert watch.growth == {"tests.unit.tidy": 0}


def test_what_only_garbage_holds_is_not_counted():
    """A descriptor a finalizer closes (the SQLite writer lock's) is not a leak
    once its owner is collected."""

    class Owner:
        def __init__(self) -> None:
            self.descriptor = os.open(os.devnull, os.O_RDONLY)
            self.cycle = self
            weakref.finalize(self, os.close, self.descriptor)

    gc.collect()
    watch = DescriptorWatch(limit=0)
    gc.disable()  # no collection of its own before the watch's
    try:
        Owner()  # unreachable at once, but held by its own cycle until a collection
        assert open_descriptors() == watch.start + 1
        assert watch.excess() is None
    finally:
        gc.enable()
