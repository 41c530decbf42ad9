"""What Allocate and GetPreferredAllocation accept, checked before anything is matched or written.

The kubelet passes only IDs it got from ListAndWatch, each once, from Healthy devices, and asks for at least
one device. Anything else that reaches the socket is refused with a sentence that names the field, shows the
value (shortened: callers control it) and says what is allowed. The exception class carries whose problem it
is, which the gRPC service turns into a status code: ``InvalidArgument`` (the request itself is wrong),
``NotEnoughDevices`` (it asks for more than it offers) and any other ``AllocationError`` (the node's state
does not allow it).
"""

from __future__ import annotations

from collections.abc import Sequence

from deviceplugin.devices import ID_SEPARATOR, device_id, split_id, units_of
from deviceplugin.inventory import Inventory

# Caller-controlled text in a message or a log line is cut to this many characters, and lists of IDs to this
# many entries: the kubelet copies the message into the pod's status, and a log line must stay one line.
SHOWN_CHARS = 60
SHOWN_IDS = 3


class AllocationError(Exception):
    """Allocate cannot be served in the node's present state; the text says why (FAILED_PRECONDITION)."""


class InvalidArgument(AllocationError):
    """The request itself is malformed: no kubelet would send it (INVALID_ARGUMENT)."""


class NotEnoughDevices(AllocationError):
    """The request asks for more devices than it offers (RESOURCE_EXHAUSTED)."""


def shown(text: str) -> str:
    """Caller text as a message may show it: quoted, control characters escaped, at most SHOWN_CHARS long."""
    return repr(text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "...")


def listed(items: Sequence[str]) -> str:
    """At most SHOWN_IDS items, shortened, then how many more there are."""
    parts = [shown(item) for item in items[:SHOWN_IDS]]
    if len(items) > SHOWN_IDS:
        parts.append(f"{len(items) - SHOWN_IDS} more")
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def gpus_of_ids(ids: Sequence[str], field: str, inventory: Inventory) -> list[int]:
    """The GPU index of each ID in ``field``; refuse an ID that is malformed, not advertised, or repeated."""
    advertised = sum(units_of(gpu, inventory.unit) for gpu in inventory.gpus)
    if len(ids) > advertised:  # checked first so that a huge list is refused without parsing it
        raise InvalidArgument(f"{field} holds {len(ids)} device IDs, more than the {advertised} this node "
                              "advertises; pass IDs from ListAndWatch, each once.")
    seen: set[str] = set()
    gpus = []
    for device in ids:
        try:
            uuid, number = split_id(device)
        except ValueError:
            example = device_id(inventory.gpus[0].uuid, 0) if inventory.gpus else f"GPU-<uuid>{ID_SEPARATOR}0"
            raise InvalidArgument(f"{field} holds {shown(device)}, which is not a gpushare device ID: IDs are "
                                  f"<GPU UUID>{ID_SEPARATOR}<n> with n a decimal unit number, like {example!r}, "
                                  "as ListAndWatch lists them.") from None
        index = inventory.index_by_uuid.get(uuid)
        if index is None:
            raise InvalidArgument(f"{field} holds {shown(device)}, which names GPU {shown(uuid)}, which this node "
                                  f"does not have; its GPUs are {_gpus(inventory)}.")
        count = units_of(inventory.gpu(index), inventory.unit)
        if number >= count:
            raise InvalidArgument(f"{field} holds {shown(device)}, but GPU {index} advertises {count} device(s), "
                                  f"numbered 0 to {count - 1}.")
        if device in seen:
            raise InvalidArgument(f"{field} names device {shown(device)} more than once; each device can be "
                                  "given once.")
        seen.add(device)
        gpus.append(index)
    return gpus


def _gpus(inventory: Inventory) -> str:
    return listed([gpu.uuid for gpu in inventory.gpus]) if inventory.gpus else "none (it advertises no devices)"


def check_allocate(requests: Sequence[Sequence[str]], inventory: Inventory) -> list[list[int]]:
    """The GPU of each device of each container request of one Allocate call, after every check."""
    if not requests:
        raise InvalidArgument("Allocate's container_requests is empty; the kubelet sends one entry per container, "
                              "with the IDs of the devices it gives that container.")
    gpus = []
    owner: dict[str, int] = {}
    for number, ids in enumerate(requests, start=1):
        field = _field("devices_ids", number, len(requests))
        if not ids:
            raise InvalidArgument(f"{field} is empty; the kubelet passes one device ID per unit of the "
                                  "container's limit, at least one.")
        gpus.append(gpus_of_ids(ids, field, inventory))
        for device in ids:
            if device in owner:
                raise InvalidArgument(f"Device {shown(device)} is in container requests {owner[device]} and "
                                      f"{number} of one Allocate call; a device can go to one container only.")
            owner[device] = number
    for number, (ids, indices) in enumerate(zip(requests, gpus, strict=True), start=1):
        for device, index in zip(ids, indices, strict=True):
            if not inventory.healthy(index):
                raise AllocationError(
                    f"{_field('devices_ids', number, len(requests))} holds {shown(device)}, a device of GPU "
                    f"{index}, which is Unhealthy after a critical XID (see the device plugin's log); the kubelet "
                    "hands out only Healthy devices. Delete the pod so that the extender places it on a healthy "
                    "GPU.")
    return gpus


def check_preferred(available: Sequence[str], must_include: Sequence[str], size: int, number: int, of: int,
                    inventory: Inventory) -> dict[str, int]:
    """The GPU of each device the suggestion may use: the Healthy ones of ``available``, plus ``must_include``."""
    size_field = _field("allocation_size", number, of)
    if size < 1:
        raise InvalidArgument(f"{size_field} is {size}; it must be at least 1: the number of devices the "
                              "container asks for.")
    available_field = _field("available_deviceIDs", number, of)
    must_field = _field("must_include_deviceIDs", number, of)
    gpu_of = dict(zip(available, gpus_of_ids(available, available_field, inventory), strict=True))
    must = gpus_of_ids(must_include, must_field, inventory)
    outside = [device for device in must_include if device not in gpu_of]
    if outside:
        raise InvalidArgument(f"{must_field} holds {listed(outside)}, not in {available_field}; the devices that "
                              "must be included have to be available.")
    if len(must) > size:
        raise InvalidArgument(f"{must_field} holds {len(must)} devices, more than {size_field} ({size}).")
    if size > len(available):
        raise NotEnoughDevices(f"{size_field} is {size}, but {available_field} offers only {len(available)} "
                               "device(s).")
    required = set(must_include)
    usable = {device: index for device, index in gpu_of.items() if device in required or inventory.healthy(index)}
    if len(usable) < size:
        raise NotEnoughDevices(f"{size_field} is {size}, but only {len(usable)} of the {len(available)} devices in "
                               f"{available_field} are on Healthy GPUs; the others' GPUs reported a critical XID.")
    return usable


def _field(name: str, number: int, of: int) -> str:
    return name if of == 1 else f"{name} of container request {number}"
