from __future__ import annotations

import re

import pytest

from pytest_gpuhost.specmodel.matchers import (
    Auto,
    Exact,
    Integer,
    LinkSpeed,
    Match,
    OneOf,
    Range,
    normalize_ws,
    parse_int,
)


def test_integers_compare_as_integers() -> None:
    assert Exact("0", Auto()).judge("00\n").ok
    assert Exact("16777216", Auto()).judge("16777216").ok
    assert not Exact("1", Auto()).judge("10").ok


def test_no_truncation_to_integer() -> None:
    with pytest.raises(ValueError, match="not an integer"):
        parse_int("1.5")
    verdict = Range("1", None, Auto()).judge("1.5")
    assert not verdict.ok
    assert "not an integer" in verdict.reason
    assert not Exact("1", Auto()).judge("1.9").ok


def test_multi_value_sysctl_is_whitespace_normalized() -> None:
    assert normalize_ws("4096\t87380   16777216\n") == "4096 87380 16777216"
    assert Exact("4096 87380 16777216", Auto()).judge("4096\t87380\t16777216\n").ok
    assert not Exact("4096 87380 16777216", Auto()).judge("4096\t131072\t6291456").ok


def test_range_judges_and_names_the_crossed_bound() -> None:
    expect = Range("16777216", None, Auto())
    assert expect.describe() == ">= 16777216"
    assert expect.judge("16777216").ok
    verdict = expect.judge("212992")
    assert not verdict.ok and verdict.reason == "212992 < min 16777216"
    assert Range(None, "1", Auto()).judge("4").reason == "4 > max 1"


def test_fix_value_writes_the_crossed_bound() -> None:
    assert Range("16777216", None, Auto()).fix_value("212992") == "16777216"
    assert Range(None, "1", Auto()).fix_value("4") == "1"
    both = Range("1", "10", Auto())
    assert both.fix_value("60") == "10"
    assert both.fix_value("0") == "1"
    assert OneOf(("2", "1"), Auto()).fix_value("0") == "2"
    assert Match(re.compile("a.*")).fix_value("b") is None


def test_one_of_and_match() -> None:
    assert OneOf(("0", "1"), Auto()).judge("1\n").ok
    assert not OneOf(("0", "1"), Auto()).judge("2").ok
    assert Match(re.compile(r"bbr|cubic")).judge("cubic\n").ok
    assert not Match(re.compile(r"bbr")).judge("bbr2").ok  # the whole value must match


def test_link_speed_compares_the_number() -> None:
    assert Exact("32.0 GT/s", LinkSpeed()).judge("32.0 GT/s PCIe\n").ok
    assert Exact("8.0 GT/s", LinkSpeed()).judge("8 GT/s").ok
    assert not Exact("32.0 GT/s", LinkSpeed()).judge("16.0 GT/s PCIe").ok
    assert Range("16.0 GT/s", None, LinkSpeed()).judge("32.0 GT/s PCIe").ok
    assert not Range("16.0 GT/s", None, LinkSpeed()).judge("Unknown").ok


def test_integer_domain_with_allowed_values() -> None:
    with pytest.raises(ValueError, match="1000 is not one of 128, 256, 512, 1024, 2048, 4096"):
        Integer((128, 256, 512, 1024, 2048, 4096)).validate("1000")


def test_nothing_observed_fails() -> None:
    assert not Exact("0", Auto()).judge(None).ok
    assert not Range("1", None, Auto()).judge(None).ok


def test_no_fix_value_for_a_value_without_order() -> None:
    # A kernel given "16777216" for tcp_rmem sets only its first field: never write it.
    assert Range("16777216", None, Auto()).fix_value("4096 87380 6291456") is None
