"""The crash-and-resume demo: the seed's content pipeline against real local services."""

from processors.demo.client import WorldClient
from processors.demo.world import World, serve

__all__ = ["World", "WorldClient", "serve"]
