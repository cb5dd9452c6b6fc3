"""The SDK's generated protobuf messages (`tinker_public_pb2`), loaded without the rest of the SDK.

`from tinker.proto import tinker_public_pb2` runs `tinker/__init__.py`, which loads the whole SDK and, through its
tensor types, torch: seconds of start-up and hundreds of MB in every ingress replica. The generated module needs
only protobuf, so it is loaded from its file under its own name; a later `import tinker` reuses it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

_NAME = "tinker.proto.tinker_public_pb2"


def _load() -> ModuleType:
    if _NAME in sys.modules:
        return sys.modules[_NAME]
    package = importlib.util.find_spec("tinker")
    if package is None or package.origin is None:
        raise ImportError("the tinker SDK is not installed: pip install 'tinker>=0.38,<0.39'")
    spec = importlib.util.spec_from_file_location(_NAME, Path(package.origin).parent / "proto" / "tinker_public_pb2.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"the tinker SDK at {package.origin} has no proto/tinker_public_pb2.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING:  # the SDK's stub (tinker_public_pb2.pyi) types the same module
    from tinker.proto import tinker_public_pb2 as pb
else:
    pb = _load()
