"""What the job (``runtime/``, ``metrics/``) and the tools over its files (``analysis/``) must agree
on, in the foundation layer: :mod:`.stragglers`, the one definition of a slow rank; :mod:`.heatmap`,
the one rank x interval chart of it; :mod:`.metrics_log`, the ``metrics.jsonl`` records and run
markers; :mod:`.prometheus_names`, the exported metrics' names."""
