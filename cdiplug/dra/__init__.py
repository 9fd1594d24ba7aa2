"""The DRA front end: resources with ``api: dra`` served as Kubernetes DRA drivers (resource.k8s.io/v1).

One concept per module:

- :mod:`.frontend`: :class:`DraFrontEnd`, start/reload/stop of every DRA resource;
- :mod:`.driver`: one resource as one driver (sockets, slices, health, snapshots);
- :mod:`.registration`, :mod:`.service`, :mod:`.health`: the gRPC edges (plugin registration v1,
  ``v1.DRAPlugin``/``v1beta1.DRAPlugin``, ``v1alpha1.DRAResourceHealth``); :class:`cdiplug.wire.unixserver.UnixServer` serves them (as it serves the device-plugin sockets);
- :mod:`.slices` (pure) and :mod:`.publisher`: ResourceSlices, built and kept on the API server;
- :mod:`.claims` (pure), :mod:`.prepare`, :mod:`.claimspec`, :mod:`.checkpoint`: claims read,
  prepared through the host, given a CDI spec each, and remembered across restarts;
- the Kubernetes API is :mod:`cdiplug.kube` (lightkube; credentials in kubectl's order).

Imported only when some resource has ``api: dra``: a daemon without one never loads the
Kubernetes client. Never imports :mod:`cdiplug.deviceplugin`, which never imports this.
"""
