"""py-spy tools: ``torchprof pyspy record | report | speedscope``.

* :mod:`torchprof_args.commands.pyspy`: the ``torchprof pyspy`` sub-commands (argument parsing, messages);
* :mod:`.record`: runs a command under ``py-spy record`` and publishes its raw profile;
* :mod:`.launcher`: the small script py-spy runs so that the command's exit code is kept
  (run by file path, not imported by the rest of the package);
* :mod:`.parse`: reads py-spy's raw (collapsed-stack) files into :class:`~.parse.Profile`;
* :mod:`.report`: the report table (where samples landed, attributed to your code);
* :mod:`.speedscope`: the stacks as a speedscope file (speedscope draws the flamegraph).

Import-light: importing the package imports nothing else.
"""
