"""The crash-and-resume demo: the seed's content pipeline against real local services."""

from runlog.processors.demo.client import WorldClient
from runlog.processors.demo.world import World, serve

__all__ = ["World", "WorldClient", "serve"]
