"""The generated gRPC code is current, and the protocol is the kubelet's on the wire."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

from gpushare.kubeletapi import deviceplugin_v1beta1_pb2 as plugin_api
from gpushare.kubeletapi import podresources_v1_pb2 as podresources_api

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
assert _spec is not None and _spec.loader is not None
gen_protos = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_protos)
generate = gen_protos.generate


def test_every_proto_becomes_modules_of_the_neutral_package(tmp_path: Path) -> None:
    fresh = generate(ROOT, tmp_path)
    assert {p.name for p in fresh} == {
        f"{stem}{suffix}" for stem in ("deviceplugin_v1beta1", "podresources_v1")
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")}
    # Registered under the package path, so that the plugin and the simulated kubelet share one registration.
    assert plugin_api.DESCRIPTOR.name == "gpushare/kubeletapi/deviceplugin_v1beta1.proto"
    assert podresources_api.DESCRIPTOR.name == "gpushare/kubeletapi/podresources_v1.proto"
    for stub in (tmp_path / "deviceplugin_v1beta1_pb2_grpc.py", tmp_path / "podresources_v1_pb2_grpc.py"):
        assert "from gpushare.kubeletapi import" in stub.read_text()


def test_generation_fails_clearly_without_protos(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"No \.proto files found"):
        generate(tmp_path, tmp_path / "out")


def fields(message: type) -> dict[str, tuple[int, int]]:
    descriptor = message.DESCRIPTOR  # type: ignore[attr-defined]
    return {f.name: (f.number, f.type) for f in descriptor.fields}


STRING, BOOL, MESSAGE, INT64, INT32 = (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BOOL,
                                       FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_INT64,
                                       FieldDescriptor.TYPE_INT32)


def test_the_device_plugin_api_is_v1beta1_field_for_field() -> None:
    assert plugin_api.DESCRIPTOR.package == "v1beta1"
    services = {s.full_name: [m.name for m in s.methods] for s in plugin_api.DESCRIPTOR.services_by_name.values()}
    assert services == {"v1beta1.Registration": ["Register"],
                        "v1beta1.DevicePlugin": ["GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation",
                                                 "Allocate", "PreStartContainer"]}
    list_and_watch = plugin_api.DESCRIPTOR.services_by_name["DevicePlugin"].methods_by_name["ListAndWatch"]
    assert list_and_watch.server_streaming and not list_and_watch.client_streaming
    assert fields(plugin_api.RegisterRequest) == {"version": (1, STRING), "endpoint": (2, STRING),
                                                  "resource_name": (3, STRING), "options": (4, MESSAGE)}
    assert fields(plugin_api.DevicePluginOptions) == {"pre_start_required": (1, BOOL),
                                                      "get_preferred_allocation_available": (2, BOOL)}
    assert fields(plugin_api.Device) == {"ID": (1, STRING), "health": (2, STRING), "topology": (3, MESSAGE)}
    assert fields(plugin_api.NUMANode) == {"ID": (1, INT64)}
    assert fields(plugin_api.ContainerAllocateRequest) == {"devices_ids": (1, STRING)}
    assert fields(plugin_api.ContainerAllocateResponse) == {
        "envs": (1, MESSAGE), "mounts": (2, MESSAGE), "devices": (3, MESSAGE), "annotations": (4, MESSAGE),
        "cdi_devices": (5, MESSAGE)}
    assert fields(plugin_api.Mount) == {"container_path": (1, STRING), "host_path": (2, STRING),
                                        "read_only": (3, BOOL)}
    assert fields(plugin_api.DeviceSpec) == {"container_path": (1, STRING), "host_path": (2, STRING),
                                             "permissions": (3, STRING)}
    assert fields(plugin_api.ContainerPreferredAllocationRequest) == {
        "available_deviceIDs": (1, STRING), "must_include_deviceIDs": (2, STRING), "allocation_size": (3, INT32)}
    assert fields(plugin_api.ContainerPreferredAllocationResponse) == {"deviceIDs": (1, STRING)}
    assert fields(plugin_api.PreStartContainerRequest) == {"devices_ids": (1, STRING)}


def test_the_pod_resources_api_is_v1() -> None:
    service = podresources_api.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert [m.name for m in service.methods] == ["List", "GetAllocatableResources"]
    assert fields(podresources_api.PodResources) == {"name": (1, STRING), "namespace": (2, STRING),
                                                     "containers": (3, MESSAGE)}
    assert fields(podresources_api.ContainerDevices) == {"resource_name": (1, STRING), "device_ids": (2, STRING),
                                                         "topology": (3, MESSAGE)}


def test_an_allocate_response_round_trips_on_the_wire() -> None:
    response = plugin_api.ContainerAllocateResponse(envs={"A": "1"}, mounts=[plugin_api.Mount(
        container_path="/c", host_path="/h", read_only=True)])
    assert plugin_api.ContainerAllocateResponse.FromString(response.SerializeToString()) == response
