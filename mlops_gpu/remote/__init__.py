"""Remote mode: the CLI talking to a ``mlops-gpu server`` over HTTP instead of opening the store.

Where the server is (``credentials.target``): ``MLOPS_GPU_URL`` (with ``MLOPS_GPU_TOKEN``, or the
token ``mlops-gpu login`` stored), else the credentials file ``mlops-gpu login`` wrote
(``~/.config/mlops-gpu/credentials``, mode 0600) unless a config is named (``--config`` or
``MLOPS_GPU_CONFIG``: local mode). Imports only the standard library and httpx (lazily).
"""

from mlops_gpu.remote.client import Client, RemoteError
from mlops_gpu.remote.credentials import Target, credentials_path, save, target

__all__ = ["Client", "RemoteError", "Target", "credentials_path", "save", "target"]
