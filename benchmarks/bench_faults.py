"""Each fault of the fault-injection suite on its own real 2-rank torchrun/gloo job, one row per fault.

survived: the job ended as it should (every rank trained to the end; or refused to start with a
one-line error; or, for SIGTERM, ended by SIGTERM, not a crash); partial files: ``.partial-*``,
``*.tmp``, ``*.part`` visible under the output directory; leftovers: files or directories left in
the ranks' staging directories plus publisher processes still alive; seconds: the job's wall time.
Full filesystems are small tmpfs mounts and fork failures a pids cgroup (RLIMIT_NPROC when not
root): faults that need root are reported as skipped without it.

    .venv/bin/python benchmarks/bench_faults.py [--only SUBSTRING] [--markdown]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers import faults  # noqa: E402
from helpers.fault_scenarios import FAULTS, run  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="run the faults whose name contains this")
    parser.add_argument("--markdown", action="store_true", help="print a README table")
    args = parser.parse_args()
    rows = []
    for scenario in (s for s in FAULTS if args.only in s.name):
        if (scenario.needs_mount() and not faults.can_mount()) or (
                scenario.needs_fork_limit and not faults.can_limit_forks()):
            rows.append((scenario.name, "skipped (needs root)", "-", "-", "-"))
            continue
        with tempfile.TemporaryDirectory(prefix="torchprof-fault-") as root:
            outcome = run(scenario, root)
        leftovers = len(outcome.leftovers) + len(outcome.orphans)
        rows.append((scenario.name, "yes" if outcome.survived else "NO", str(len(outcome.partials)),
                     str(leftovers), f"{outcome.seconds:.1f}"))
        print(f"{rows[-1][0]:50s} {rows[-1][1]:>8s} {rows[-1][2]:>8s} {rows[-1][3]:>9s} {rows[-1][4]:>8s}",
              file=sys.stderr, flush=True)
    header = ("fault", "survived", "partial files", "leftovers", "seconds")
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|---|---|---|---|---|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        print(f"{header[0]:50s} {header[1]:>8s} {header[2]:>13s} {header[3]:>9s} {header[4]:>8s}")
        for row in rows:
            print(f"{row[0]:50s} {row[1]:>8s} {row[2]:>13s} {row[3]:>9s} {row[4]:>8s}")
    return 0 if all(row[1] in ("yes", "skipped (needs root)") for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
