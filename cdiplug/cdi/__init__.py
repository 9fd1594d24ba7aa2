"""Container Device Interface: the spec model, names, versions, the writer and validation.

- (:mod:`cdiplug.models.names`: kinds, device names and qualified names by the CDI rules; IDs mapped to names.)
- :mod:`.spec`: the spec as attrs classes and its JSON form.
- :mod:`.build`: ``build_spec(kind, snapshot)``, a spec from the device model.
- :mod:`.version`: the lowest ``cdiVersion`` a spec's content needs.
- :mod:`.writer`: ``SpecWriter``, atomic one-file-per-kind writes into the CDI folder.
- :mod:`.sweep`: ``sweep(folder, stale)``, the removal of cdiplug's stale files there.
- :mod:`.annotations`: ``cdi.k8s.io/...`` annotations for runtimes that read those.
- :mod:`.validate`: checks a spec file as strictly as the reference library (``cdiplug cdi validate``).

Submodules are imported where used; importing this package imports nothing else.
"""
