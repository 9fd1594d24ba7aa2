"""The values every layer shares: devices and snapshots, resource configuration, names, the world."""
