"""torchtitan's config parser with the ``[torch_profile]`` section.

:func:`profiled_config_class` derives, from whatever ``Config`` the registry function returns, a
subclass with one more field, ``torch_profile``
(:class:`~torchprof_args.capture.frameworks.torchtitan_config.TorchProfileSection`), whose owner is the same
trainer class with :class:`~torchprof_args.capture.frameworks.torchtitan_trainer.TorchProfileTrainerMixin` in
front.  :func:`parse_config` is torchtitan's ``ConfigManager.parse_args`` with that class.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from torchprof_args.capture.frameworks.torchtitan_config import SECTION, TorchProfileSection, run_config
from torchprof_args.capture.frameworks.torchtitan_trainer import TorchProfileTrainerMixin

__all__ = ["parse_config", "profiled_config_class"]


_DERIVED: dict[type, type] = {}


def profiled_config_class(base: type) -> type:
    """``base`` (a torchtitan ``Trainer.Config`` or a subclass) with the ``torch_profile`` section,
    owned by the same trainer class with the profiling mixin; one class per ``base``."""
    if base in _DERIVED:
        return _DERIVED[base]
    owner = base._owner  # type: ignore[attr-defined]  # torchtitan's Configurable wiring
    namespace = {"__module__": __name__, "__qualname__": f"{owner.__name__}.Config",
                 "__annotations__": {SECTION: TorchProfileSection}, SECTION: dataclasses.field(
                     default_factory=TorchProfileSection)}
    config: type = dataclasses.dataclass(kw_only=True, slots=True)(type("Config", (base,), namespace))
    trainer = type(f"TorchProfiled{owner.__name__}", (TorchProfileTrainerMixin, owner),
                   {"Config": config, "__module__": __name__})
    assert config._owner is trainer  # type: ignore[attr-defined]  # set by Configurable.__init_subclass__
    _DERIVED[base] = config
    return config


def parse_config(argv: Sequence[str]) -> Any:
    """torchtitan's ``ConfigManager.parse_args(argv)`` (``--module``, ``--config``, then tyro's
    ``--section.field`` flags) with the ``[torch_profile]`` section; raises
    :class:`TorchProfileArgsError` on a bad or conflicting setting."""
    import tyro
    from torchtitan.config.manager import ConfigManager, custom_registry

    manager = ConfigManager()
    loaded, rest = manager._load_config(list(argv))  # noqa: SLF001  (its --module/--config reading)
    config_class = profiled_config_class(type(loaded))
    values = {field.name: getattr(loaded, field.name) for field in dataclasses.fields(loaded) if field.init}
    default = config_class(**values)
    config = tyro.cli(config_class, args=rest, default=default, registry=custom_registry)
    manager.config = config
    manager._validate_config()  # noqa: SLF001
    run_config(config)
    return config
