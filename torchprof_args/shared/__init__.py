"""What the in-job side (``metrics/``) and the offline side (``analysis/``) must agree on, in the
foundation layer: :mod:`.stragglers`, the one definition of a slow rank."""
