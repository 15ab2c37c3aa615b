"""The config floor: the schema (the one home of every key and default), the group factories'
arguments, and composing a config.

    probe.config.schema      ProbeConfig, its enums, which keys shape what is stored
    probe.config.arguments   each group factory's signature as that group's schema
    probe.config.compose     register the schemas with Hydra and compose a config

``CONFIG_DIR`` is the folder of probe's own YAML files (conf/ in a checkout, probe/conf in a
wheel).
"""

from pathlib import Path

__all__ = ["CONFIG_DIR"]


def _config_dir() -> Path:
    # A wheel ships the configs as probe/conf; a source checkout keeps them at the top level.
    package = Path(__file__).resolve().parent.parent
    packaged = package / "conf"
    return packaged if packaged.is_dir() else package.parent / "conf"


CONFIG_DIR = _config_dir()
