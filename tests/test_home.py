"""`realm_hf.home.kept`: a cache entry read back, built when missing or damaged, and a home that cannot be written."""

import json
import logging

from realm_hf.home import kept


def _counting(value):
    calls = []

    def build():
        calls.append(1)
        return value

    return build, calls


def _read(path):
    return json.loads(path.read_text())["value"]


def _write(value, path):
    path.write_text(json.dumps({"value": value}))


def test_an_entry_is_built_once_then_read_back(tmp_path):
    build, calls = _counting(42)
    path = tmp_path / "home" / "things" / "entry.json"  # the parent is made
    assert kept(path, _read, build, _write, "the thing") == 42
    assert kept(path, _read, build, _write, "the thing") == 42
    assert len(calls) == 1 and _read(path) == 42


def test_a_damaged_entry_is_built_again_and_replaced(tmp_path, caplog):
    build, calls = _counting(7)
    path = tmp_path / "entry.json"
    path.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="realm_hf.home"):
        assert kept(path, _read, build, _write, "the thing") == 7
    assert len(calls) == 1 and _read(path) == 7
    assert f"Rebuilding the thing: could not read {path}" in caplog.text


def test_a_home_that_cannot_be_written_only_warns(tmp_path, caplog):
    build, calls = _counting("fresh")
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")
    path = blocker / "entry.json"
    with caplog.at_level(logging.WARNING, logger="realm_hf.home"):
        assert kept(path, _read, build, _write, "the thing") == "fresh"
        assert kept(path, _read, build, _write, "the thing") == "fresh"
    assert len(calls) == 2 and caplog.text.count("Could not keep the thing in") == 2
