"""Compiled code in a trace: its regions, graphs and Triton kernels (:mod:`.regions`) and, where the job
wrote inductor's provenance beside the trace, each generated kernel's module (:mod:`.kernel_modules`)."""
