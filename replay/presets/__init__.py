"""Cluster presets as YAML files (schema in :mod:`replay.cluster_spec`); listed by
:func:`replay.cluster_presets.list_presets`. Copy one to start a cluster file of your own."""

__all__: list[str] = []
