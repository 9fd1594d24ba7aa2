"""cdiplug: a Kubernetes device plugin daemon serving several extended resources from one process.

The core package (this one) holds the device model, configuration, the backend host, the two front ends
(device plugin, DRA) and the node that runs them, the allocator, CDI handling and the command line. Hardware backends live
in the separate ``backends`` package and are found through the ``cdiplug.backends`` entry point
group; nothing here imports them.
"""

__version__ = "0.1.0"
