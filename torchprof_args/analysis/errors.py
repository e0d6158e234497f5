"""The one exception type of the trace toolkit."""

from __future__ import annotations


class TraceError(Exception):
    """Bad input for a trace tool (not JSON, truncated, not a Kineto trace...).

    The message is one sentence that names the file and the problem; the command line prints it
    as is and exits with status 1.
    """
