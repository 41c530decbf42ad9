"""The plugin's writes to the API server: pod annotations (with a resourceVersion precondition) and node status.

Patches are JSON merge patches sent through the official client; raw JSON replies keep pods in the same
dict form the watch delivers.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from kubernetes.client.exceptions import ApiException

from deviceplugin.inventory import Inventory
from gpushare.contract import ANN_NODE_INVENTORY, RESOURCE_GPU_COUNT, encode_inventory, unit_annotation
from gpushare.kube.informer import Obj

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
# Allocate waits on these calls, and the kubelet on Allocate: never hang on a stuck API server.
API_TIMEOUT_S = 10.0


class Conflict(Exception):
    """The pod changed since it was read (HTTP 409)."""


class Gone(Exception):
    """The pod no longer exists (HTTP 404)."""


class PodWriter:
    def __init__(self, core_api: Any) -> None:
        self._core = core_api

    def annotate(self, namespace: str, name: str, resource_version: str, annotations: dict[str, str]) -> Obj:
        """Merge ``annotations`` into the pod only if it is still at ``resource_version``."""
        body = {"metadata": {"resourceVersion": resource_version, "annotations": annotations}}
        try:
            response = self._core.patch_namespaced_pod(name, namespace, body, _content_type=MERGE_PATCH,
                                                       _preload_content=False, _request_timeout=API_TIMEOUT_S)
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(f"pod {namespace}/{name} changed since resourceVersion {resource_version}") from None
            if exc.status == 404:
                raise Gone(f"pod {namespace}/{name} no longer exists") from None
            raise
        result: Obj = json.loads(response.data)
        return result

    def read(self, namespace: str, name: str) -> Obj | None:
        try:
            response = self._core.read_namespaced_pod(name, namespace, _preload_content=False,
                                                      _request_timeout=API_TIMEOUT_S)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        result: Obj = json.loads(response.data)
        return result


class NodePublisher:
    """Keeps the node's ``aliyun.com/gpu-count`` and GPU inventory annotation in step with the inventory.

    Runs in its own thread so that an unreachable API server delays the node's view, never Allocate.
    """

    def __init__(self, core_api: Any, node_name: str, inventory: Inventory, retry_s: float = 5.0) -> None:
        self._core = core_api
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
                except (ApiException, OSError) as exc:
                    log.warning("Cannot update node %s with its GPUs (%s); retrying in %.0f s.", self._node,
                                getattr(exc, "reason", exc), self._retry_s, extra={"node": self._node})
                    self._stop.wait(self._retry_s)
                    continue
            self._inventory.wait(seen, timeout_s=1.0)

    def publish(self) -> None:
        entries = self._inventory.entries()
        inventory = encode_inventory(entries)
        count = len(entries)
        if self._written == (inventory, count):
            return
        status = {"status": {"capacity": {RESOURCE_GPU_COUNT: str(count)},
                             "allocatable": {RESOURCE_GPU_COUNT: str(count)}}}
        annotations = {"metadata": {"annotations": {ANN_NODE_INVENTORY: inventory,
                                                    **unit_annotation(self._inventory.unit)}}}
        # Reading the raw reply returns the connection to the pool without building a V1Node.
        _ = self._core.patch_node_status(self._node, status, _content_type=MERGE_PATCH, _preload_content=False,
                                         _request_timeout=API_TIMEOUT_S).data
        _ = self._core.patch_node(self._node, annotations, _content_type=MERGE_PATCH, _preload_content=False,
                                  _request_timeout=API_TIMEOUT_S).data
        first = self._written is None
        self._written = (inventory, count)
        self.published.set()
        log.log(logging.INFO if first else logging.DEBUG, "Published %d GPU(s) on node %s.", count, self._node,
                extra={"node": self._node, "gpus": count})
