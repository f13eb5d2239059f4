"""Every answer of a target is checked for its shape before anything reads
it; what is not the agent's is said, never a TypeError, AssertionError or RecursionError."""

from __future__ import annotations

import pytest

from pytest_gpuhost.host import Glob, HostError, Read, Stat
from pytest_gpuhost.host.answers import batch_problem, hello_problem, take_message


def test_the_agent_s_own_answers_pass() -> None:
    requests: list[dict[str, object]] = [
        Read("a").wire(), Stat("b").wire(), Glob("c/*").wire(), {"op": "run"},
                {"op": "lock"}, {"op": "write"}]
    replies = [{"value": b"10\n"},
               {"value": {"type": "file", "size": 3, "mode": 0o644, "rdev": [0, 0]}},
               {"value": [["c/x", b"1"], ["c/y", {"error": "gone", "errno": 2}], ["c/z", None]]},
               {"value": {"returncode": 0, "stdout": "", "stderr": ""}},
               {"value": 5}, {"error": "EPERM", "errno": 1}]
    assert batch_problem(requests, replies) is None


@pytest.mark.parametrize(("request_", "reply", "words"), [
    (Read("a").wire(), {"value": 7}, "a read value of the wrong shape: 7"),
    (Glob("c/*").wire(), {"value": 7}, "a glob value of the wrong shape: 7"),
    (Glob("c/*").wire(), {"value": [["c/x", 7]]}, "a glob value of the wrong shape"),
    (Stat("b").wire(), {"value": {"type": "file", "size": "3", "mode": 1}}, "a stat value"),
    ({"op": "run"}, {"value": {"returncode": True, "stdout": "", "stderr": ""}}, "a run value"),
    ({"op": "lock"}, {"value": "5"}, "a lock value of the wrong shape: '5'"),
    (Read("a").wire(), {"error": 7}, "an error without its text and errno"),
    (Read("a").wire(), {"nothing": 1}, "without a value or an error"),
    (Read("a").wire(), 7, "7 where the reply to a read request belongs"),
    (Glob("c/*/v").wire(), {"value": [["x", None]]},
     "a glob match 'x' outside its pattern 'c/*/v'"),
    (Glob("c/*/v").wire(), {"value": [["c/d/w", None]]}, "a glob match 'c/d/w' outside"),
    (Glob("c/*/v").wire(), {"value": [["c/../v", None]]}, "a glob match 'c/../v' outside"),
])
def test_a_reply_of_the_wrong_shape_is_named(request_: dict[str, object], reply: object,
                                             words: str) -> None:
    problem = batch_problem([request_], [reply])
    assert problem is not None and words in problem


def test_a_batch_of_the_wrong_length_or_kind_is_named() -> None:
    assert batch_problem([Read("a").wire()], 7) == "7 where 1 replies belong"
    assert batch_problem([Read("a").wire()], []) == "[] where 1 replies belong (0 came)"


def test_a_200000_deep_array_is_no_message() -> None:
    data = b"[" * 200000 + b"]" * 200000
    with pytest.raises(HostError, match="not the agent's answer: b'\\[\\[\\["):
        take_message(bytearray(b"%d\n" % len(data) + data))


def test_a_hello_is_checked() -> None:
    good = {"hello": {"protocol": 1, "euid": 0, "identity": {"root": "/", "hostname": "h"}}}
    assert hello_problem(good) is None
    assert hello_problem({"hello": None, "error": "the host root cannot be opened"}) is None
    assert hello_problem({"hello": {"euid": "0", "identity": {}}}) is not None
    assert hello_problem([1]) == "[1] where the agent's hello belongs"
