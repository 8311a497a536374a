"""The wheel and the editable install expose the same entry points, the entry_points/ folder ships inside the
package (never as a top-level `entry_points` module), and the core imports with torch alone."""

import configparser
import importlib.metadata
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
    wheel_eps = dict(parser["sglang.srt.plugins"])
    assert wheel_eps == {"inkling": "sglang_inkling_backend.entry_points.sglang:register"}
    installed = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="sglang.srt.plugins")
                 if ep.value.startswith("sglang_inkling_backend")}
    assert installed == wheel_eps


def test_core_imports_with_torch_only():
    code = ("import sys; sys.modules['sglang'] = None; sys.modules['triton'] = None; sys.modules['mlx'] = None\n"
            "import sglang_inkling_backend as s\n"
            "from sglang_inkling_backend.reference import attention\n"
            "print(s.mxfp8.BLOCK)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "32"
