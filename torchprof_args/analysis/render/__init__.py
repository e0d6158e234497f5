"""Renderings (layer 6 of :mod:`torchprof_args.analysis`): plain text (:mod:`.text`: summaries,
operator tables), the self-contained HTML report (:mod:`.report`) and its inline SVG charts
(:mod:`.svg`).  They render results (summaries, the ``--json`` documents); they compute nothing."""
