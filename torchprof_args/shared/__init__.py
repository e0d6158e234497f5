"""What the in-job side (``metrics/``) and the offline side (``analysis/``) must agree on, in the
foundation layer: :mod:`.stragglers`, the one definition of a slow rank, and :mod:`.heatmap`, the
one rank x interval chart of it."""
