"""The extender's garbage collections: CPython's pace, at the moments the extender picks (after its answers)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from conftest import gc_collections

from extender import collector


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generations collected during the test, under the thresholds the extender sets once it is ready; the
    process's own thresholds, and its objects' place in the collector, come back after."""
    thresholds = gc.get_threshold()
    collector.freeze()
    try:
        with gc_collections() as seen:
            yield seen
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def young_objects(count: int) -> list[list[int]]:
    """``count`` container objects that stay alive: a young generation that grows by that many."""
    return [[] for _ in range(count)]


def test_cpython_collects_by_itself_only_far_past_its_default_young_threshold(collections: list[int]) -> None:
    assert gc.get_threshold() == (collector.BACKSTOP * collector.YOUNG, collector.MIDDLE,
                                  collector.FULL_COLLECTION_AFTER)
    gc.collect(0)
    collections.clear()
    kept = young_objects(5 * collector.YOUNG)  # five collections' worth under CPython's default
    assert collections == []
    kept += young_objects(collector.BACKSTOP * collector.YOUNG)
    assert collections == [0]


def test_the_collection_due_is_cpythons_by_its_default_thresholds(collections: list[int]) -> None:
    gc.collect(1)  # every count at zero but the full one's
    collections.clear()
    kept = young_objects(collector.YOUNG // 2)
    collector.collect_due()
    assert collections == []  # not due yet
    kept += young_objects(collector.YOUNG)
    collector.collect_due()
    assert collections == [0]
    collector.collect_due()
    assert collections == [0]  # nothing more is due once it was made

    # A middle collection once more young ones than its threshold came since the last; a full one once more middle
    # ones than FULL_COLLECTION_AFTER did, as CPython does.
    for _ in range(collector.MIDDLE - gc.get_count()[1]):
        gc.collect(0)
    kept += young_objects(2 * collector.YOUNG)
    collector.collect_due()
    assert collections[-1] == 0
    kept += young_objects(2 * collector.YOUNG)
    collector.collect_due()
    assert collections[-1] == 1

    for _ in range(collector.FULL_COLLECTION_AFTER - gc.get_count()[2]):
        gc.collect(1)
    for _ in range(collector.MIDDLE + 1):
        gc.collect(0)
    kept += young_objects(2 * collector.YOUNG)
    collector.collect_due()
    assert collections[-1] == 1
    for _ in range(collector.MIDDLE + 1):
        gc.collect(0)
    kept += young_objects(2 * collector.YOUNG)
    collector.collect_due()
    assert collections[-1] == 2
    assert gc.get_count()[1:] == (0, 0)
