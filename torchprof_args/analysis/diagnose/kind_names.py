"""The names of the diagnose kinds whose findings later kinds read (``kind_ctx.earlier_of``).

That kind's ``KIND`` takes its value from here and its readers name it by the same constant: one
definition of each name, and no kind imports another (the kinds are plugins).
"""

from __future__ import annotations

__all__ = ["EXPERT_IMBALANCE", "STRAGGLER"]

#: ``straggler`` and ``collective_skew`` leave to it the ranks whose experts receive too many tokens.
EXPERT_IMBALANCE = "expert_imbalance"
#: ``collective_skew`` leaves out the waiting its stragglers' extra work explains.
STRAGGLER = "straggler"
