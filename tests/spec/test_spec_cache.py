"""A spec parsed once is loaded from pytest's cache directory: the same model, and parsed anew
whenever anything it depends on changed; never taken from a place another user could write."""

from __future__ import annotations

import importlib.util
import os
import pickle
import re
import shutil
import stat
import sys
import textwrap
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import ModuleType

import msgspec
import pytest

from pytest_gpuhost import builtin
from pytest_gpuhost.specmodel import SectionParser, Spec, SpecError, cache, load_spec, parse_spec
from pytest_gpuhost.specmodel.cache import load_spec_cached
from pytest_gpuhost.specmodel.matchers import Exact
from pytest_gpuhost.testing.fakehost import FakeHost

from ..conftest import BLACKWELL8
from .test_spec import sysctl_entries

KINDS = {kind.section: kind for kind in builtin.pytest_gpuhost_check_kinds()}
CONDITIONS = set(builtin.pytest_gpuhost_conditions())


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    made = tmp_path / "cache" / "d" / "gpuhost-spec"
    made.mkdir(parents=True, mode=0o755)
    return made


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "blackwell8.yaml"
    shutil.copy(BLACKWELL8, path)
    return path


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The spec files the cache parsed (rather than loaded), in order."""
    parsed: list[Path] = []
    real = parse_spec

    def counted(data: bytes, path: Path, shown: str, parsers: Mapping[str, SectionParser],
                conditions: Iterable[str]) -> Spec:
        parsed.append(path)
        return real(data, path, shown, parsers, conditions)

    monkeypatch.setattr(cache, "parse_spec", counted)
    return parsed


def value(spec: Spec) -> object:
    """What the test kind's model holds."""
    return getattr(spec.sections["cached_kind"], "value")  # noqa: B009 - a model of any kind


def entries(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.pickle"))


def same(one: Spec, other: Spec) -> bool:
    """The same model, field for field (a domain compares by identity, so ``==`` cannot say
    it of two specs of the same file)."""
    return shape(one) == shape(other)


def shape(value: object) -> object:
    if isinstance(value, msgspec.Struct):
        return type(value), tuple(shape(getattr(value, name))
                                  for name in value.__struct_fields__)
    if isinstance(value, dict):
        return {key: shape(each) for key, each in value.items()}
    if isinstance(value, (list, tuple, frozenset, set)):
        return type(value), [shape(each) for each in value]
    if isinstance(value, re.Pattern):
        return value.pattern, value.flags
    if hasattr(value, "__dict__"):
        return type(value), shape(vars(value))
    return value


def test_a_spec_parsed_once_is_loaded_as_the_same_model(directory: Path, spec_file: Path,
                                                        parses: list[Path]) -> None:
    first = load_spec_cached(directory, spec_file, KINDS, CONDITIONS)
    assert parses == [spec_file] and len(entries(directory)) == 1
    entry = entries(directory)[0]
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    second = load_spec_cached(directory, spec_file, KINDS, CONDITIONS)
    assert parses == [spec_file]  # loaded, not parsed
    assert same(second, first) and same(second, load_spec(spec_file, KINDS, CONDITIONS))
    assert second.sections.keys() == first.sections.keys() and second.path == spec_file


def test_without_a_directory_every_load_parses(spec_file: Path, parses: list[Path]) -> None:
    load_spec_cached(None, spec_file, KINDS, CONDITIONS)
    load_spec_cached(None, spec_file, KINDS, CONDITIONS)
    assert parses == [spec_file, spec_file]


def test_an_edited_spec_is_parsed_again(directory: Path, spec_file: Path,
                                        parses: list[Path]) -> None:
    load_spec_cached(directory, spec_file, KINDS, CONDITIONS)
    spec_file.write_text(spec_file.read_text().replace("{value: 10,", "{value: 1,", 1))
    edited = load_spec_cached(directory, spec_file, KINDS, CONDITIONS)
    assert len(parses) == 2 and len(entries(directory)) == 2
    assert same(edited, load_spec(spec_file, KINDS, CONDITIONS))
    swappiness = next(entry for entry in sysctl_entries(edited) if entry.key == "vm.swappiness")
    assert isinstance(swappiness.expect, Exact) and swappiness.expect.value == "1"


@pytest.mark.parametrize("change", ["display", "conditions", "kinds", "path"])
def test_what_else_a_parse_depends_on_is_part_of_the_key(directory: Path, spec_file: Path,
                                                         parses: list[Path],
                                                         change: str) -> None:
    load_spec_cached(directory, spec_file, KINDS, CONDITIONS)
    kinds, conditions, path = dict(KINDS), set(CONDITIONS), spec_file
    display: Callable[[Path], str] = str
    if change == "display":  # where the messages and every entry's `where` point
        display = lambda p: p.name  # noqa: E731
    elif change == "conditions":
        conditions.add("another")
    elif change == "kinds":
        kinds["another"] = kinds["sysctl"]
    else:
        path = spec_file.with_name("copy.yaml")
        shutil.copy(spec_file, path)
    load_spec_cached(directory, path, kinds, conditions, display=display)
    assert len(parses) == 2 and len(entries(directory)) == 2


def test_an_error_is_never_kept(directory: Path, tmp_path: Path, parses: list[Path]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nsysctl:\n  vm.swappiness: [1\n")
    for _ in range(2):
        with pytest.raises(SpecError, match=r"bad.yaml:\d+: not valid YAML"):
            load_spec_cached(directory, bad, KINDS, CONDITIONS)
    assert len(parses) == 2 and entries(directory) == []


# ---------------------------------------------------------------------------------------------
# What is kept: a run of this package's kinds; its code is part of the key


KIND_SOURCE = '''
import msgspec


class Model(msgspec.Struct, frozen=True):
    value: object


class CachedKind:
    section = "cached_kind"

    def parse(self, node, context):
        return Model({kind!r})
'''


@pytest.fixture
def kind_module(tmp_path: Path) -> Iterator[ModuleType]:
    """A kind plugin's module (one file, outside any package), imported as Python would."""
    path = tmp_path / "gpuhost_cached_kind.py"
    path.write_text(textwrap.dedent(KIND_SOURCE.format(kind="first")))
    found = importlib.util.spec_from_file_location("gpuhost_cached_kind", path)
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    sys.modules["gpuhost_cached_kind"] = module
    found.loader.exec_module(module)
    yield module
    sys.modules.pop("gpuhost_cached_kind", None)


def test_a_run_with_a_kind_of_another_plugin_parses_every_time(
        directory: Path, tmp_path: Path, kind_module: ModuleType, parses: list[Path]) -> None:
    """Its parse may depend on code or state no key covers (a conftest's helpers, an option)."""
    path = tmp_path / "spec.yaml"
    path.write_text("version: 1\ncached_kind: {}\nsysctl: {vm.swappiness: 10}\n")
    kinds = {**KINDS, "cached_kind": kind_module.CachedKind()}
    assert value(load_spec_cached(directory, path, kinds, CONDITIONS)) == "first"
    assert value(load_spec_cached(directory, path, kinds, CONDITIONS)) == "first"
    assert len(parses) == 2 and list(directory.iterdir()) == []


def test_an_edit_of_any_file_of_the_package_is_another_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """Every .py file of the package is signed, in every subpackage; a dangling link (an
    editor's lock file) is passed over, ``__pycache__`` is not code."""
    package = tmp_path / "package"
    for name in ("__init__.py", "spec/__init__.py", "spec/cache.py", "checks/deep/sysctl.py"):
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text("x = 1\n")
    monkeypatch.setattr(cache, "__file__", str(package / "spec" / "cache.py"))

    def signature() -> bytes:
        cache._code_signature.cache_clear()  # a new process, as the next run is
        return cache._code_signature()

    request.addfinalizer(cache._code_signature.cache_clear)  # this package's, after
    first = signature()
    (package / "checks" / ".#sysctl.py").symlink_to("root@host.1234:1700000000")
    (package / "checks" / "__pycache__").mkdir()
    (package / "checks" / "__pycache__" / "sysctl.py").write_text("not code")
    assert signature() == first
    (package / "checks" / "deep" / "sysctl.py").write_text("x = 22\n")
    assert signature() != first
    edited = signature()
    (package / "checks" / "new.py").write_text("")
    assert signature() != edited


def test_a_model_that_does_not_pickle_is_returned_and_not_kept(
        directory: Path, tmp_path: Path, kind_module: ModuleType, parses: list[Path]) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("version: 1\ncached_kind: {}\n")

    class Unpicklable(kind_module.CachedKind):  # type: ignore[misc,name-defined]  # run time's
        def parse(self, node: object, context: object) -> object:
            return kind_module.Model(lambda: None)

    Unpicklable.__module__ = "pytest_gpuhost.checks.unpicklable"  # as if one of this package's
    spec = load_spec_cached(directory, path, {"cached_kind": Unpicklable()}, ())
    assert callable(value(spec)) and parses == [path]
    assert list(directory.iterdir()) == []  # no entry, no temporary file left


# ---------------------------------------------------------------------------------------------
# Places another user could write are passed over


def test_a_group_writable_directory_of_ours_is_made_private_and_used(
        directory: Path, spec_file: Path, parses: list[Path]) -> None:
    directory.chmod(0o775)
    load_spec_cached(directory, spec_file, KINDS, CONDITIONS)
    load_spec_cached(directory, spec_file, KINDS, CONDITIONS)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert len(parses) == 1


def test_a_directory_of_another_user_is_neither_read_nor_written(
        directory: Path, spec_file: Path, parses: list[Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    load_spec_cached(directory, spec_file, KINDS, CONDITIONS)
    kept = {entry: entry.read_bytes() for entry in entries(directory)}
    mode = directory.stat().st_mode
    monkeypatch.setattr(os, "geteuid", lambda: directory.stat().st_uid + 1)  # another user's
    load_spec_cached(directory, spec_file, KINDS, CONDITIONS)
    spec_file.write_text(spec_file.read_text() + "\n")
    load_spec_cached(directory, spec_file, KINDS, CONDITIONS)
    assert len(parses) == 3
    assert {entry: entry.read_bytes() for entry in entries(directory)} == kept
    assert directory.stat().st_mode == mode  # not made private: it is not ours


def test_a_directory_through_a_symlink_is_neither_read_nor_written(
        directory: Path, spec_file: Path, tmp_path: Path, parses: list[Path]) -> None:
    link = tmp_path / "link"
    link.symlink_to(directory)
    for _ in range(2):
        load_spec_cached(link, spec_file, KINDS, CONDITIONS)
    assert len(parses) == 2 and entries(directory) == []


def test_a_world_writable_directory_of_another_user_is_passed_over(
        directory: Path, spec_file: Path, parses: list[Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    directory.chmod(0o777)
    monkeypatch.setattr(os, "geteuid", lambda: directory.stat().st_uid + 1)
    load_spec_cached(directory, spec_file, KINDS, CONDITIONS)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o777 and entries(directory) == []
    directory.chmod(0o755)


@pytest.mark.parametrize("above", ["writable by others", "another user's"])
def test_a_directory_under_one_another_user_can_change_is_neither_read_nor_written(
        tmp_path: Path, spec_file: Path, parses: list[Path], above: str) -> None:
    """Whoever can write a directory above the cache's can swap what is below it for a link
    to any private directory of root's: root would write its entries there and prune them."""
    parent = tmp_path / "shared"
    directory = parent / "d" / "gpuhost-spec"
    directory.mkdir(parents=True)
    directory.chmod(0o700)
    if above == "writable by others":
        parent.chmod(0o777)
    elif os.geteuid() == 0:
        os.chown(parent, 65534, 65534)
    else:
        pytest.skip("giving a directory to another user needs root")
    for _ in range(2):
        load_spec_cached(directory, spec_file, KINDS, CONDITIONS)
    assert len(parses) == 2 and list(directory.iterdir()) == []
    parent.chmod(0o1777)  # sticky, as /tmp: another user can no longer replace what is in it
    if above == "writable by others":
        load_spec_cached(directory, spec_file, KINDS, CONDITIONS)
        load_spec_cached(directory, spec_file, KINDS, CONDITIONS)
        assert len(parses) == 3 and len(entries(directory)) == 1


def test_an_entry_is_unpickled_only_after_its_own_key(
        directory: Path, spec_file: Path, parses: list[Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    load_spec_cached(directory, spec_file, KINDS, CONDITIONS)
    (entry,) = entries(directory)
    header, _, body = entry.read_bytes().partition(b"\n")
    assert header == cache.MAGIC + entry.stem.encode()
    entry.write_bytes(cache.MAGIC + b"0" * 64 + b"\n" + body)  # another key's header

    class Refuses:
        dumps = staticmethod(pickle.dumps)

        @staticmethod
        def loads(data: object) -> object:
            raise AssertionError("unpickled an entry of another key")

    monkeypatch.setattr(cache, "pickle", Refuses)
    load_spec_cached(directory, spec_file, KINDS, CONDITIONS)
    assert len(parses) == 2


def test_an_entry_with_a_second_link_is_passed_over(directory: Path, spec_file: Path,
                                                    tmp_path: Path, parses: list[Path]) -> None:
    load_spec_cached(directory, spec_file, KINDS, CONDITIONS)
    (entry,) = entries(directory)
    os.link(entry, tmp_path / "second-link")
    load_spec_cached(directory, spec_file, KINDS, CONDITIONS)
    assert len(parses) == 2
    assert (tmp_path / "second-link").stat().st_nlink == 1  # the entry was replaced, not written


def test_a_killed_runs_temporary_file_goes_when_an_entry_is_written(
        directory: Path, spec_file: Path) -> None:
    stale, fresh = directory / ".abc.0123.tmp", directory / ".def.4567.tmp"
    for each in (stale, fresh):
        each.write_bytes(b"half an entry")
    old = (cache.STALE_TEMPORARY_NS * 2) // 10**9
    os.utime(stale, (stale.stat().st_atime - old, stale.stat().st_mtime - old))
    load_spec_cached(directory, spec_file, KINDS, CONDITIONS)
    assert not stale.exists() and fresh.exists()  # another run may still be writing that one


@pytest.mark.parametrize("how", ["group-writable", "another user's", "a symlink", "a FIFO",
                                 "cut short", "another key's", "not a pickle",
                                 "another version's classes"])
def test_an_entry_not_to_trust_or_not_whole_is_parsed_anew_and_replaced(
        directory: Path, spec_file: Path, tmp_path: Path, parses: list[Path],
        monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    load_spec_cached(directory, spec_file, KINDS, CONDITIONS)
    parses.clear()
    (entry,) = entries(directory)
    good = entry.read_bytes()
    outside = tmp_path / "outside.pickle"  # a canary: a link's target is never written
    outside.write_bytes(good)
    outside.chmod(0o600)
    if how == "group-writable":
        entry.chmod(0o620)
    elif how == "another user's":
        real = os.fstat

        def fstat(fd: int) -> os.stat_result:
            found = real(fd)
            if stat.S_ISREG(found.st_mode) and found.st_size == len(good):
                fields = list(found)
                fields[stat.ST_UID] = found.st_uid + 1
                return os.stat_result(fields)
            return found

        monkeypatch.setattr(os, "fstat", fstat)
    elif how == "a symlink":
        entry.unlink()
        entry.symlink_to(outside)
    elif how == "a FIFO":
        entry.unlink()
        os.mkfifo(entry, 0o600)
    elif how == "cut short":
        entry.write_bytes(good[:len(good) // 2])
    elif how == "another key's":
        spec_file.write_text(spec_file.read_text() + "\n")
        load_spec_cached(directory, spec_file, KINDS, CONDITIONS)
        parses.clear()
        (other,) = set(entries(directory)) - {entry}
        other.write_bytes(good)  # the first key's entry under the second's name
        entry = other
    elif how == "not a pickle":
        entry.write_bytes(b"version: 1\n")
    else:  # a class that an older version's entry names, gone from this one
        gone = ModuleType("gpuhost_gone_module")
        exec("class Gone:\n    pass\n", gone.__dict__)
        gone.Gone.__module__ = gone.__name__
        monkeypatch.setitem(sys.modules, gone.__name__, gone)
        entry.write_bytes(pickle.dumps((cache.FORMAT, entry.stem, gone.Gone())))
        monkeypatch.delitem(sys.modules, gone.__name__)
    spec = load_spec_cached(directory, spec_file, KINDS, CONDITIONS)
    assert len(parses) == 1 and same(spec, load_spec(spec_file, KINDS, CONDITIONS))
    monkeypatch.undo()
    assert stat.S_ISREG(entry.lstat().st_mode) and entry.read_bytes() != b"version: 1\n"
    assert stat.S_IMODE(entry.lstat().st_mode) == 0o600
    assert outside.read_bytes() == good
    parses.clear()
    assert same(load_spec_cached(directory, spec_file, KINDS, CONDITIONS), spec)
    assert parses == []  # the replacement is loaded


def test_the_least_recently_used_entries_go_past_the_number_kept(
        directory: Path, spec_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache, "KEEP", 2)
    made: list[Path] = []
    for value in range(3):
        if value == 2:  # the first is used again: the second is now the least recently used
            spec_file.write_text("version: 1\nsysctl:\n  vm.swappiness: 0\n")
            load_spec_cached(directory, spec_file, KINDS, CONDITIONS)
        spec_file.write_text(f"version: 1\nsysctl:\n  vm.swappiness: {value}\n")
        load_spec_cached(directory, spec_file, KINDS, CONDITIONS)
        (new,) = set(entries(directory)) - set(made)
        if value < 2:
            os.utime(new, ns=((value + 1) * 10**9, (value + 1) * 10**9))
        made.append(new)
    assert entries(directory) == sorted([made[0], made[2]])


# ---------------------------------------------------------------------------------------------
# Whole runs


def test_inline_runs_of_one_process_load_the_spec_the_run_before_kept(
        pytester: pytest.Pytester, fake: FakeHost, parses: list[Path]) -> None:
    """pytester drops the modules each inline run imported, so the second run's kinds and the
    classes of the model it loads are a new import of the same modules: they must agree (a
    kind cached from the first run did not know the second's models: a collection error)."""
    fake.gpu("0000:01:00.0", audio=False, max_read_request=4096)
    pytester.makefile(".yaml", spec="version: 1\npcie:\n  max_read_request: 4096\n"
                                    "  aspm: \"off\"\ncpuidle: {disabled: [C6]}\n")
    runs = [pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}") for _ in range(3)]
    assert len(parses) == 1  # the first run parsed, the next two loaded
    assert list((pytester.path / ".pytest_cache" / "d" / "gpuhost-spec").glob("*.pickle"))
    outcomes = [run.parseoutcomes() for run in runs]
    assert outcomes[0] == outcomes[1] == outcomes[2] and "errors" not in outcomes[0], outcomes
    assert runs[0].ret == runs[2].ret


def test_pyyamls_own_file_is_part_of_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found where the import would find it, without importing it (a cached run never does)."""
    import yaml

    imported = cache._yaml_signature()
    assert imported.startswith(os.fsencode(yaml.__file__ or "") + b"\0")
    monkeypatch.delitem(sys.modules, "yaml")
    assert cache._yaml_signature() == imported
    assert "yaml" not in sys.modules
