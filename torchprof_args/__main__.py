"""``python -m torchprof_args`` is the ``torchprof`` command."""

from torchprof_args.console import main

raise SystemExit(main())
