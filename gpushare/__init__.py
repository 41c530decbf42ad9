"""gpushare core: the annotation/resource contract, the cluster model and the placement policies."""

__version__ = "0.1.0"
