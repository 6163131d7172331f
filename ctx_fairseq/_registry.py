"""Helpers to import every submodule of a package (so that fairseq's
``register_*`` decorators run) and to list the architectures this plugin adds."""

import importlib
import pkgutil
from typing import Dict, List


def import_all_submodules(package_name: str) -> None:
    """Import ``package_name`` and every module directly inside it."""
    package = importlib.import_module(package_name)
    for info in pkgutil.iter_modules(package.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package_name}.{info.name}")


def plugin_models() -> Dict[str, type]:
    """Model name -> model class for every model registered by ctx_fairseq
    (importing this module imported the package, which registers them)."""
    from fairseq.models import MODEL_REGISTRY

    return {
        name: cls
        for name, cls in sorted(MODEL_REGISTRY.items())
        if cls.__module__.startswith("ctx_fairseq.")
    }


def plugin_architectures() -> List[str]:
    """Every architecture name (presets included) registered by ctx_fairseq."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    return sorted(
        name
        for name, cls in ARCH_MODEL_REGISTRY.items()
        if cls.__module__.startswith("ctx_fairseq.")
    )
