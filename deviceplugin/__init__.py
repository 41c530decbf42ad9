"""The kubelet device plugin for ``aliyun.com/gpu-mem``: one fake device per memory unit of each GPU."""
