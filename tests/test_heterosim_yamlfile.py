"""Tests for heterosim.yamlfile: one wording for unreadable files, bad YAML and schema versions."""

from __future__ import annotations

import pytest

from heterosim.errors import ConfigError, TopologyError
from heterosim.yamlfile import read_yaml


def test_reads_a_document(tmp_path):
    p = tmp_path / "a.yaml"
    p.write_text("schema_version: 1\nx: [1, 2]\n")
    assert read_yaml(p, "thing file", schema_version=1) == {"schema_version": 1, "x": [1, 2]}


def test_errors_name_the_file_and_the_fix(tmp_path):
    p = tmp_path / "a.yaml"
    with pytest.raises(ConfigError, match=f"thing file {p}: cannot read it"):
        read_yaml(p, "thing file")
    p.write_text("x: [1,\n")
    with pytest.raises(TopologyError, match=f"thing file {p}: not valid YAML"):
        read_yaml(p, "thing file", error=TopologyError)
    p.write_text("- 1\n")
    with pytest.raises(ConfigError, match=rf"thing file {p}: schema_version None is not supported; write "
                                          r"schema_version: 1 and a list$"):
        read_yaml(p, "thing file", schema_version=1, hint=" and a list")


def test_alias_bomb_is_refused_quickly(tmp_path):
    """Nine levels of nine aliases (9**9 nodes expanded) under a description: refused in well under 10 s."""
    import time

    lines = ["schema_version: 1", "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    lines.append("description: *a9")
    p = tmp_path / "bomb.yaml"
    p.write_text("\n".join(lines) + "\n")
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"not valid YAML \(its aliases expand to more than 1,000,000 nodes"):
        read_yaml(p, "cases file")
    assert time.monotonic() - t0 < 10


def test_aliases_count_at_each_use():
    """A 3-item list used twice through an alias: 1 map + 2 keys + 2 x (1 list + 3 items) = 11 nodes."""
    import yaml

    from heterosim.yamlfile import _expanded_size

    node = yaml.compose("a: &x [1, 2, 3]\nb: *x\n", Loader=yaml.SafeLoader)
    assert _expanded_size(node) == 11


def test_binary_file_is_one_error(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    with pytest.raises(ConfigError, match=rf"^cluster file {p}: not a text \(UTF-8 YAML\) file$"):
        read_yaml(p, "cluster file")
