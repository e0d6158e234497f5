"""On-demand tracing: a running job traces a few iterations when ``torchprof trigger`` asks.

``protocol`` (the control directory's files and request validation), ``window`` (the window all
ranks agree on), ``wire`` (its fixed-size broadcast), ``controller`` (inside the job),
``registry`` (pid -> job on a node), ``trigger`` (the command), ``dynolog`` (the Kineto daemon
environment check).  Import-light: torch loads only inside the collectives.
"""
