"""The extension is tied to the torch it was compiled against: any other torch is an ImportError that names
both versions and the rebuild command, raised before the extension is loaded (not an undefined symbol)."""

import subprocess
import sys

import pytest
import torch

import speculant
from speculant._build import TORCH_VERSION


def test_built_against_the_installed_torch():
    assert TORCH_VERSION == torch.__version__


def test_check_torch_names_both_versions_and_the_fix():
    speculant.check_torch("2.15.0", "2.15.0")
    with pytest.raises(ImportError, match=r"built against torch 2\.11\.0\+cu130, but torch 2\.15\.0 is "
                                          r"installed\. Rebuild it .*--no-build-isolation"):
        speculant.check_torch("2.11.0+cu130", "2.15.0")


def test_import_under_another_torch_is_a_clear_import_error():
    code = ("import torch\ntorch.__version__ = '2.99.0'\n"
            "try:\n    import speculant\nexcept ImportError as e:\n    print('ImportError:', e)\n"
            "import sys\nprint('extension loaded:', 'speculant._core' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert f"built against torch {TORCH_VERSION}, but torch 2.99.0 is installed" in out
    assert "extension loaded: False" in out
