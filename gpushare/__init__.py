"""gpushare core: the annotation/resource contract, the cluster model and the placement policies."""

from gpushare.native import check_fresh

__version__ = "0.1.0"

check_fresh()
