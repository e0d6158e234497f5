"""One renderer of a diagnosis's gaps (``analysis/render/gaps.py``): one sentence per flag, for the
text of ``torchprof diagnose`` and the HTML report alike (the report on real CPU-only traces:
tests/test_diagnose.py::test_report_opens_with_the_findings)."""

from __future__ import annotations

from torchprof_args.analysis.diagnose.documents import JobGap
from torchprof_args.analysis.diagnose.finding import Gap
from torchprof_args.analysis.render.gaps import gap_text_lines, group_gaps

FLAG = "--torch-profile-activities cpu cuda"
NO_GPU = "the trace has no GPU kernels (a CPU-only run or CPU activity only), so the GPU cannot be analysed"
NO_PEAK = "the trace has no GPU kernels, so there is no GPU peak to compare with"
#: The gaps `torchprof diagnose --json` gives for tests/data/cpu_2rank_ddp_rank0.json.gz.
CPU_ONLY = [*(JobGap(kind, NO_GPU, FLAG, [0])
              for kind in ("gpu_idle", "exposed_comm", "launch_bound", "host_sync", "memcpy")),
            JobGap("low_mfu", NO_PEAK, FLAG, [0])]


def test_a_cpu_only_job_names_the_flag_once_with_every_kind_and_reason() -> None:
    (line,) = gap_text_lines(CPU_ONLY)
    assert line == ("to see gpu_idle, exposed_comm, launch_bound, host_sync, memcpy, low_mfu, record with "
                    f"{FLAG} ({NO_GPU}; low_mfu: {NO_PEAK})")


def test_one_sentence_per_flag_in_the_order_they_first_appear() -> None:
    gaps = [Gap("host_sync", "no stacks.", "--torch-profile-with-stack"),
            Gap("low_mfu", "no shapes.", "--torch-profile-record-shapes"),
            Gap("host_sync", "no stacks.", "--torch-profile-with-stack"),  # rank 1
            Gap("pipeline_bubble", "one stage only.", None)]
    flags = [g.flag for g in group_gaps(gaps)]
    assert flags == ["--torch-profile-with-stack", "--torch-profile-record-shapes", None]
    assert gap_text_lines(gaps) == [
        "to see host_sync, record with --torch-profile-with-stack (no stacks)",
        "to see low_mfu, record with --torch-profile-record-shapes (no shapes)",
        "to see pipeline_bubble, no flag records it (one stage only)"]
    assert gap_text_lines([]) == []
