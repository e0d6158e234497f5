"""Flag declarations as data: the registry, shared argparse types and the docs' flag table.

Import-light and feature-free: features declare their groups in their own ``config`` modules
and register them here; :mod:`torchprof_args.capture.config` turns parsed flags into configs.
"""

from torchprof_args.capture.flags.registry import (
    Flag,
    FlagGroup,
    add_flag_groups,
    config_field,
    config_values,
    flag_value,
    register_group,
    registered_groups,
    was_given,
)

__all__ = [
    "Flag", "FlagGroup", "add_flag_groups", "config_field", "config_values", "flag_value", "register_group",
    "registered_groups", "was_given",
]
