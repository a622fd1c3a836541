"""The one YAML config file: where it is found, how it is validated, what it becomes.

Invariants:
- Unknown keys and bad values are rejected with ``ConfigError`` naming the file, the key path
  and what was expected; nothing is written anywhere before a config has validated.
- Relative paths in the file (the SQLite store, ``state_dir``) are relative to the file's folder.
- The backend types are those of ``config.registry``: the built-ins and the
  ``mlops_gpu.backends`` entry point group (a backend plugin's model, never its SDK).
- Imports only ``mlops_gpu.model`` (plus pydantic and PyYAML).
"""

from mlops_gpu.config.backends import (
    BackendConfigBase,
    FakeBackendConfig,
    KubernetesBackendConfig,
    LocalBackendConfig,
    SlurmBackendConfig,
)
from mlops_gpu.config.base import NodeConfig
from mlops_gpu.config.locate import ConfigError, find_config, load_config, user_config_path
from mlops_gpu.config.registry import BackendRegistryError, backend_types
from mlops_gpu.config.schema import BackendConfig, Config
from mlops_gpu.config.starter import starter_config

__all__ = [
    "BackendConfig",
    "BackendConfigBase",
    "BackendRegistryError",
    "Config",
    "ConfigError",
    "FakeBackendConfig",
    "KubernetesBackendConfig",
    "LocalBackendConfig",
    "NodeConfig",
    "SlurmBackendConfig",
    "backend_types",
    "find_config",
    "load_config",
    "starter_config",
    "user_config_path",
]
