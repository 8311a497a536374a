"""``settings``: the package's one reader of the environment. Every ``INKLING_*`` name the package mentions is a
``Setting`` there, no other module of the package reads ``os.environ``, and each kind of setting has one meaning
(a choice, refused outside its values naming the variable; a flag, on for anything but unset, empty and ``0``)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from sglang_inkling_backend import settings

PACKAGE = Path(settings.__file__).resolve().parent
ENV_NAME = re.compile(r"(?<![A-Za-z0-9_])INKLING_[A-Z0-9_]*[A-Z0-9]")
ENV_READ = re.compile(r"os\.environ\.get|os\.environ\[[^]]+\](?!\s*=)|os\.getenv|environ\.get\(")


def _package_sources():
    return [p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts]


def test_no_module_but_settings_reads_the_environment():
    readers = {str(p.relative_to(PACKAGE)): n for p in _package_sources()
               if p.name != "settings.py" and (n := len(ENV_READ.findall(p.read_text(encoding="utf-8"))))}
    assert not readers, f"modules reading os.environ outside settings.py: {readers}"


def test_the_scan_finds_a_read():
    assert ENV_READ.findall('x = os.environ.get("A")\ny = os.environ["B"]\nos.environ["C"] = "1"') == [
        "os.environ.get", 'os.environ["B"]']


def test_every_inkling_name_in_the_package_is_a_setting():
    names = {s.name for s in settings.SETTINGS}
    mentioned = {name: str(p.relative_to(PACKAGE)) for p in _package_sources()
                 for name in ENV_NAME.findall(p.read_text(encoding="utf-8"))}
    # SGLang's own variables that contain the word are not ours (ENV_NAME leaves them out)
    unknown = {n: where for n, where in mentioned.items() if n not in names}
    assert not unknown, f"INKLING_* names in the package that settings.py does not define: {unknown}"


@pytest.mark.parametrize("value, expected", [(None, "auto"), ("", "auto"), ("triton", "triton"),
                                             (" FlashInfer ", "flashinfer")])
def test_a_choice_reads_its_value_or_default(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("INKLING_DECODE_KERNEL", raising=False)
    else:
        monkeypatch.setenv("INKLING_DECODE_KERNEL", value)
    assert settings.decode_kernel() == expected


@pytest.mark.parametrize("read, name, bad", [(settings.decode_kernel, "INKLING_DECODE_KERNEL", "cuda"),
                                             (settings.extend_kernel, "INKLING_EXTEND_KERNEL", "fa3"),
                                             (settings.extend_new_keys, "INKLING_EXTEND_NEW_KEYS", "pool"),
                                             (settings.verify_graphs, "INKLING_VERIFY_GRAPHS", "yes"),
                                             (settings.mxfp8_query, "INKLING_MXFP8_QUERY", "fp4")])
def test_a_choice_outside_its_values_names_the_variable(monkeypatch, read, name, bad):
    monkeypatch.setenv(name, bad)
    with pytest.raises(ValueError, match=f"{name} must be one of .*got '{bad}'"):
        read()


@pytest.mark.parametrize("read, name", [(settings.e4m3_by_integers_forced, "INKLING_E4M3_BY_INTEGERS"),
                                        (settings.hopper_decode_disabled, "INKLING_DISABLE_HOPPER_DECODE"),
                                        (settings.triton_interpreter, "TRITON_INTERPRET")])
@pytest.mark.parametrize("value, on", [(None, False), ("", False), ("0", False), ("1", True), ("yes", True)])
def test_a_flag_is_on_for_anything_but_unset_empty_and_zero(monkeypatch, read, name, value, on):
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)
    assert read() is on


def test_verify_graphs_reads_one_or_zero(monkeypatch):
    monkeypatch.setenv("INKLING_VERIFY_GRAPHS", "0")
    assert settings.verify_graphs() is False
    monkeypatch.delenv("INKLING_VERIFY_GRAPHS")
    assert settings.verify_graphs() is True


def test_kernel_family_takes_only_the_two_kernel_settings():
    with pytest.raises(ValueError, match="INKLING_DECODE_KERNEL or INKLING_EXTEND_KERNEL"):
        settings.kernel_family("INKLING_EXTEND_NEW_KEYS")


def test_the_readme_table_lists_every_package_setting():
    readme = (PACKAGE.parent / "README.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `(INKLING_[A-Z0-9_]+)` \|", readme, flags=re.M))
    missing = {s.name for s in settings.SETTINGS} - rows
    assert not missing, f"README's settings table lacks {sorted(missing)}"
