"""The kubelet's gRPC APIs (device plugin v1beta1, PodResources v1), generated from protos/ at install time.

A neutral home: the device plugin serves these APIs and the local cluster's simulated kubelet calls them, so
both import the same generated modules (a second copy would clash in protobuf's global registry) without
either importing the other.
"""
