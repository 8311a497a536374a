"""The wheel and the editable install expose the same entry points, the entry_points/ folder ships inside the
package (never as a top-level `entry_points` module), and the core imports with torch alone."""

import configparser
import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_entry_points_and_layout(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("sglang_inkling_backend-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_txt = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        parser = configparser.ConfigParser()
        parser.read_string(zf.read(entry_txt).decode())
    assert "sglang_inkling_backend/entry_points/sglang.py" in names
    assert not any(n.startswith("entry_points/") for n in names)
    metal = sorted(Path(n).name for n in names if n.endswith(".metal"))
    assert metal == sorted(p.name for p in (ROOT / "sglang_inkling_backend/mlx/metal").glob("*.metal")) != []
    assert "sglang_inkling_backend/hosts/vllm/backend.py" in names
    expected = {"sglang.srt.plugins": {"inkling": "sglang_inkling_backend.entry_points.sglang:register"},
                "vllm.general_plugins": {"inkling": "sglang_inkling_backend.entry_points.vllm:register"},
                "vllm.platform_plugins": {"inkling_cpu": "sglang_inkling_backend.entry_points.vllm:cpu_platform"}}
    for group, eps in expected.items():
        assert dict(parser[group]) == eps, group
        installed = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=group)
                     if ep.value.startswith("sglang_inkling_backend")}
        assert installed == eps, f"{group}: the editable install's metadata differs from the wheel's (reinstall)"


def test_core_imports_with_torch_only():
    code = ("import sys; sys.modules['sglang'] = None; sys.modules['triton'] = None; sys.modules['mlx'] = None\n"
            "import sglang_inkling_backend as s\n"
            "from sglang_inkling_backend.reference import attention\n"
            "print(s.mxfp8.BLOCK)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "32"


def test_the_cpu_servers_environment_finds_this_pythons_scripts_first():
    """SGLang's JIT C++ builds in the server (NGRAM's n-gram corpus) run ``ninja``, which the test extras install
    next to this Python: the server's PATH starts there, as an activated venv's does."""
    from demo.cpu_host import cpu_env

    env = cpu_env(base={"PATH": "/usr/bin:/bin"})
    assert env["PATH"].split(os.pathsep) == [os.path.dirname(sys.executable), "/usr/bin", "/bin"]
    assert shutil.which("ninja", path=env["PATH"]) is not None, "ninja (the test extras) is not installed"
