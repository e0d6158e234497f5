"""The diagnose kinds, one module each, every one of the shape :mod:`..registry` describes (and
lists them in order); a finding's ``kind`` is its module's name."""
