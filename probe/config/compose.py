"""Composing a config: the schemas go into Hydra's ConfigStore here, when a command or a caller
composes, never on import (reading a file needs no Hydra).

    cfg = compose(["model=resnet18", "layers=[layer4]", "output.path=feats.h5"])
    probe.run(cfg)

``register(name, schema)`` makes ``<name>_schema`` available to conf/<name>.yaml's defaults
list: the run's schema (``ProbeConfig``, with every group factory's arguments) for ``config``,
an analysis's own for its command.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from omegaconf import DictConfig

from probe.config import CONFIG_DIR, folders  # noqa: F401  (folders: the run folder's resolver)

__all__ = ["register", "compose"]


def register(name: str = "config", schema: type | None = None) -> None:
    """Put ``schema`` (default: the run's ``ProbeConfig`` and the group factories' arguments)
    into Hydra's ConfigStore as ``<name>_schema``."""
    from hydra.core.config_store import ConfigStore

    if schema is None:
        from probe.config.schema import ProbeConfig

        schema = ProbeConfig
        _register_arguments()
    ConfigStore.instance().store(name=f"{name}_schema", node=schema)


@functools.cache
def _register_arguments() -> None:
    # every group file's factory, read from the source once per process
    from probe.config import arguments

    arguments.register(CONFIG_DIR)


def compose(overrides: Sequence[str] = (), *, name: str = "config",
            schema: type | None = None) -> DictConfig:
    """conf/<name>.yaml composed with ``overrides``, as the command line would compose it
    (``schema``: the command's own, for an analysis's config)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register(name, schema)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return hydra_compose(name, [str(o) for o in overrides])
