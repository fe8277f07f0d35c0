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
