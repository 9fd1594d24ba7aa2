"""cdiplug's one Kubernetes client: credentials found in kubectl's order, calls over lightkube.

- :mod:`.credentials`: where the API server is and how to authenticate (``--kubeconfig``,
  ``$KUBECONFIG``, ``~/.kube/config``, then in-cluster); bounded reads, errors naming the file.
  Imports no HTTP client.
- :mod:`.client`: the :class:`~cdiplug.kube.client.KubeClient` protocol and its lightkube
  implementation; every call bounded in time, every failure one error naming the call, the
  server and the credentials' source (:mod:`.failures`).
- :mod:`.factory`: the one way a client is made (:func:`~cdiplug.kube.factory.default_client`),
  and the process's one client (:class:`~cdiplug.kube.factory.SharedClient`), which the daemon
  hands the DRA front end and the node's own Node.

- :mod:`.node_labels`, :mod:`.events`, :mod:`.config_label` and :mod:`.own_node`: what the
  daemon does with its own Node (``cdiplug.dev/`` labels, Events, the label choosing its named
  configuration; README "Mixed fleets").

Used by the DRA front end, the node, the daemon and ``cdiplug node-capacity``; below the front
ends, above the host. This package imports nothing on its own, so importing :mod:`.credentials` never loads
lightkube: a daemon serving only device-plugin resources never does.
"""
