"""When the extender's cyclic garbage collector runs: once an answer to kube-scheduler is out, not in the middle of
one.

CPython collects its youngest generation whenever 700 more container objects have been made than freed, in the
thread that makes the 700th: on the event loop in the middle of a filter, or in a bind's or the watch's thread while a
filter waits for the interpreter's lock. Every tenth collection is a middle one, which walks what the policies' memos
made since (0.8-2 ms). kube-scheduler sends the next pod's filter only once it has run its own plugins for that pod,
so a collection made as soon as an answer is written (``collect_due``) overlaps that work instead of adding to the
answer. The pace of collections is CPython's own; only their moment moves. CPython's trigger stays, ``BACKSTOP``
times later, for an extender that answers nothing while its threads make objects (the watch of a busy cluster between
GPU pods).
"""

from __future__ import annotations

import gc

# CPython's default thresholds of the young and middle generations: what ``collect_due`` keeps to.
YOUNG = 700
MIDDLE = 10
# Collections of the middle generation between two full ones, once the first list is frozen (CPython's default is
# 10). Binds replace the cache's node states, so the objects made since the freeze soon number as many as those
# frozen: at 5,000 nodes under kube-scheduler's pace a full collection came every 4-6 s, walked them all for 66-94 ms
# with every filter and bind waiting, and freed next to nothing (the cache's objects hold no cycles and go by
# reference counting). At 1,000 one comes every few minutes under that load, still in time for the rare cycle that
# outlives two young collections.
FULL_COLLECTION_AFTER = 1000
# CPython collects by itself once this many times ``YOUNG`` objects are outstanding: rarely between answers a few
# milliseconds apart, and a young generation this size still takes a few milliseconds to walk.
BACKSTOP = 20


def freeze() -> None:
    """Collect, exempt every object alive from the collector from now on (the first list of the cluster and the
    policies' view of it: hundreds of thousands of long-lived objects at thousands of nodes, which every full
    collection would walk), and leave the moments of the next collections to ``collect_due``."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(BACKSTOP * YOUNG, MIDDLE, FULL_COLLECTION_AFTER)


def collect_due() -> None:
    """Make the collection that CPython's default thresholds call for by now, if any (a generation is collected once
    its count passes its threshold, as CPython does): for a caller that has just written an answer and reads the next
    request once this returns."""
    young, middle, full = gc.get_count()
    if young > YOUNG:
        gc.collect(0 if middle <= MIDDLE else 1 if full <= FULL_COLLECTION_AFTER else 2)
