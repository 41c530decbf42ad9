"""``kubectl inspect gpushare``: GPU memory allocation per node, GPU and pod, read from the Kubernetes API."""
