"""On-demand tracing: a running job traces a few iterations when ``torchprof trigger`` asks.

``config`` (its flags), ``protocol`` (the control directory's files and request validation),
``window`` (the window all ranks agree on: data; the timeline turns it into actions), ``wire``
(its fixed-size broadcast), ``inbox`` (rank 0 takes and answers requests), ``controller``
(inside the job: the collectives, the pacing), ``registry`` (pid -> job on a node), ``dynolog``
(the Kineto daemon environment check).  The command is :mod:`torchprof_args.commands.trigger`.
Import-light: torch loads only inside the collectives.
"""
