"""The device-plugin front end: resources served over the kubelet's device plugin API v1beta1.

- :mod:`.frontend`: :class:`DevicePluginFrontEnd`, every device-plugin resource through the
  kubelet's lifecycle (start, registration, kubelet restarts, reload, release).
- :mod:`.resource`: one served resource's snapshot pipeline.
- :mod:`.server`: the gRPC edge (protobuf, sockets, status codes).
- :mod:`.allocator`: request validation, replicas, preparation through the host, answers.
- :mod:`.preferred`: the core preferred-allocation policy.
- :mod:`.registration`, :mod:`.kubelet_watch`, :mod:`.release` (with :mod:`cdiplug.wire.pod_resources`): talking
  to the kubelet.

It stands on :mod:`cdiplug.host` and never imports the DRA front end.
"""
