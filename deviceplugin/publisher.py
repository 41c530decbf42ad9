"""Publishes the node's GPUs to the API server: ``aliyun.com/gpu-count`` and the GPU inventory annotation."""

from __future__ import annotations

import logging
import threading

from deviceplugin.inventory import Inventory
from gpushare.contract import ANN_NODE_INVENTORY, RESOURCE_GPU_COUNT, encode_inventory, unit_annotation
from gpushare.kube.api import KubeError, Nodes

log = logging.getLogger(__name__)


class NodePublisher:
    """Keeps the node's ``aliyun.com/gpu-count`` and GPU inventory annotation in step with the inventory.

    Runs in its own thread so that an unreachable API server delays the node's view, never Allocate.
    """

    def __init__(self, nodes: Nodes, node_name: str, inventory: Inventory, retry_s: float = 5.0) -> None:
        self._nodes = nodes
        self._node = node_name
        self._inventory = inventory
        self._retry_s = retry_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.published = threading.Event()
        self._written: tuple[str, int] | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="node-publisher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._inventory.wake()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        seen = -1
        while not self._stop.is_set():
            version = self._inventory.version
            if version != seen:
                try:
                    self.publish()
                    seen = version
                except KubeError as exc:
                    log.warning("%s Retrying in %.0f s.", exc, self._retry_s, extra={"node": self._node})
                    self._stop.wait(self._retry_s)
                    continue
            self._inventory.wait(seen, timeout_s=1.0)

    def publish(self) -> None:
        entries = self._inventory.entries()
        inventory = encode_inventory(entries)
        count = len(entries)
        if self._written == (inventory, count):
            return
        self._nodes.patch_status(self._node, {"capacity": {RESOURCE_GPU_COUNT: str(count)},
                                              "allocatable": {RESOURCE_GPU_COUNT: str(count)}})
        self._nodes.annotate(self._node, {ANN_NODE_INVENTORY: inventory, **unit_annotation(self._inventory.unit)})
        first = self._written is None
        self._written = (inventory, count)
        self.published.set()
        log.log(logging.INFO if first else logging.DEBUG, "Published %d GPU(s) on node %s.", count, self._node,
                extra={"node": self._node, "gpus": count})
