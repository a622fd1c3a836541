"""The one YAML config file: where it is found, how it is validated, what it becomes.

Invariants:
- Unknown keys and bad values are rejected with ``ConfigError`` naming the file, the key path
  and what was expected; nothing is written anywhere before a config has validated.
- Relative paths in the file (the SQLite store, ``state_dir``) are relative to the file's folder.
- Imports only ``mlops_gpu.model`` (plus pydantic and PyYAML).
"""

from mlops_gpu.config.locate import ConfigError, find_config, load_config, user_config_path
from mlops_gpu.config.schema import (
    BackendConfig,
    Config,
    FakeBackendConfig,
    KubernetesBackendConfig,
    LocalBackendConfig,
    NodeConfig,
    SlurmBackendConfig,
)
from mlops_gpu.config.starter import starter_config

__all__ = [
    "BackendConfig",
    "Config",
    "ConfigError",
    "FakeBackendConfig",
    "KubernetesBackendConfig",
    "LocalBackendConfig",
    "NodeConfig",
    "SlurmBackendConfig",
    "find_config",
    "load_config",
    "starter_config",
    "user_config_path",
]
