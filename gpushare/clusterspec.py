"""The description of a simulated cluster: nodes, their CPU and memory, and their GPUs.

One YAML file serves three readers: the local cluster creates the nodes from it, the simulated NVML
backend of the device plugin reads each node's GPUs from it, and the demo and tests write it.

    nodes:
      - name: gpu-node-1
        cpu: "32"
        memory: 128Gi
        labels: {gpushare: "true"}
        gpus:
          - {model: Tesla-V100-SXM2-16GB, memoryMiB: 16160, numa: 0}
          - {model: Tesla-V100-SXM2-16GB, memoryMiB: 16160, numa: 0, nvlink: [0]}
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

# Names and keys quoted in an error are cut to this length: they come from the file, which may hold anything.
SHOWN_KEY_CHARS = 40


class GPUSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    model: str
    memory_mib: int = Field(alias="memoryMiB", gt=0)
    uuid: str | None = None
    numa: int | None = None
    nvlink: list[int] = Field(default_factory=list)
    used_mib: int = Field(default=0, alias="usedMiB", ge=0)


class NodeSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    cpu: str = "32"
    memory: str = "128Gi"
    pods: str = "110"
    labels: dict[str, str] = Field(default_factory=lambda: {"gpushare": "true"})
    annotations: dict[str, str] = Field(default_factory=dict)
    gpus: list[GPUSpec] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _dns_name(cls, value: str) -> str:
        if not value or len(value) > 253 or value.lower() != value or " " in value:
            raise ValueError(f"node name {value[:SHOWN_KEY_CHARS]!r} is not a lowercase DNS name")
        return value

    def gpu_uuid(self, index: int) -> str:
        """A stable UUID for a simulated GPU that has none in the file."""
        given = self.gpus[index].uuid
        if given:
            return given
        digest = hashlib.sha1(f"{self.name}/{index}".encode()).hexdigest()
        return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


class ClusterSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nodes: list[NodeSpec] = Field(default_factory=list)

    def node(self, name: str) -> NodeSpec:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"The cluster description has no node named {name!r}.")


class ClusterSpecError(ValueError):
    """A cluster description file that cannot be used; the text is one sentence naming the file and the problem."""


def load_cluster_spec(path: str | Path) -> ClusterSpec:
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ClusterSpecError(f"Cannot read the cluster description {path}: {exc.strerror or exc}; check the "
                               "path and its permissions.") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ClusterSpecError(f"The cluster description {path} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at "
                               f"offset {exc.start}); save it as UTF-8.") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "it cannot be parsed"
        raise ClusterSpecError(f"The cluster description {path} is not valid YAML{where}: {problem}.") from None
    if data is None:  # an empty file describes a cluster without nodes
        data = {}
    if not isinstance(data, dict):
        raise ClusterSpecError(f"The cluster description {path} holds a YAML {type(data).__name__} at its top "
                               "level; it must be a mapping with a nodes: list, as in gpushare.clusterspec's example.")
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        field = ".".join(str(part)[:SHOWN_KEY_CHARS] for part in first["loc"]) or "the top level"
        more = f"; {len(errors) - 1} more problem(s) follow" if len(errors) > 1 else ""
        raise ClusterSpecError(f"The cluster description {path} is invalid at {field}: {first['msg']}{more}.") from None
