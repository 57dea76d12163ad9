"""What counts as run-to-run noise in a tool result, and what does not."""

from __future__ import annotations

import pytest

from proxy.detect import normalize
from proxy.detect.normalize import mask


@pytest.mark.parametrize("noisy, masked", [
    ("at 2026-11-02T10:11:12Z done", "at \x00 done"),
    ("at 2026-11-02 10:11:12.5+01:00 done", "at \x00 done"),
    ("took 12:30:45.123 then", "took \x00 then"),
    ("id 550e8400-e29b-41d4-a716-446655440000 ok", "id \x00 ok"),
    ("ptr 0x7ffeabcd1234", "ptr \x00"),
    ("in 12ms, then 3.5 seconds, then 5s", "in \x00, then \x00, then \x00"),
    ("Date: Mon, 3 Jan 2024 over", "Date: \x00 over"),
    ("Thu 12 February 2023", "\x00"),
    ("worker pid 1234 and PID:42", "worker \x00 and \x00"),
    ("Exit Code: 1\nProcess Group PGID: 29753 and pgid=7", "Exit Code: 1 Process Group \x00 and \x00"),
    ("wrote /tmp/build-8f3a/out.json: ok", "wrote \x00: ok"),
    ("wrote /private/var/folders/ab/x.log", "wrote \x00"),
    (r"at C:\Users\me\AppData\Local\Temp\x.log", "at C:\\Users\\me\x00"),
    ("\x1b[32mpending\x1b[0m", "\x00pending\x00"),
    ("\x1b]0;title\x07text", "\x00text"),
    ("commit 3f9a2c1b7d", "commit \x00"),
    ("  many \n\t spaces  ", "many spaces"),
    ("see /root/.npm/_logs/2026-11-24T01_05_00_000Z-debug-0.log", "see /root/.npm/_logs/\x00-debug-0.log"),
    ("build_2026-11-24_01-05-00.log", "build_\x00.log"),
])
def test_noise_is_masked(noisy, masked):
    assert mask(noisy) == masked


@pytest.mark.parametrize("meaningful", [
    "def handler(request): return respond(request, status=200)",
    "Monday at the office, Sunday off",
    "the file src/tmp_helpers.py has 1234567 lines",  # a pure number is data, not an id
    "accessed defaced",  # pure letters are words
    "Spid spider pIDs",
    "version 3.11 and 42 items",
])
def test_meaning_is_kept(meaningful):
    assert mask(meaningful) == " ".join(meaningful.split())


@pytest.mark.parametrize("result, failed", [
    ('{"exit": 1, "output": "FAILED tests/test_a.py::test_x"}', True),
    ('{"exit_code": 2, "stdout": "", "stderr": "make: *** [all] Error 2"}', True),
    ('{"returncode": 0, "stdout": "ok"}', False),
    ('{"exit": 0, "output": "3 passed"}', False),
    ('{"exitCode": 1}', True),
    ('{"status": "error", "message": "timeout"}', True),
    ('{"status": "failed", "build": 12}', False),  # a status the tool read (a CI build's), not its own failure
    ('{"exit": true}', False),
])
def test_a_json_result_with_a_non_zero_exit_is_an_error(result, failed):
    assert normalize.is_error_form(result) is failed


@pytest.mark.parametrize("result, failed", [
    ("No more results.", True),  # the ReAct FEVER agent's Lookup that finds nothing
    ("Could not find [American folklore 1964]. Similar: ['Folklore of the United States', 'Jersey Devil']", True),
    ("No results found", True),  # Cursor's codebase search
    ("No matching files found.", True),
    ("Element with index 1260 not found", True),  # a browser agent's click on an element that is gone
    ("Nothing happens.", True),
    ("The file /etc/app.conf does not exist.", True),
    # The same words inside an answer that says something else, or after it, are not its form.
    ("Found 3 results: a.py, b.py, c.py. No more results.", False),
    ("Results for `parse`:\nsrc/parse.py:1 def parse(): ...\nnot found in tests/", False),
    ("No results found for `x`.\n" + "src/other.py:1 a near match\n" * 40, False),  # a long answer with results
])
def test_a_short_answer_that_only_says_nothing_was_found_is_an_error(result, failed):
    assert normalize.is_error_form(result) is failed


def test_an_answer_is_read_without_what_the_call_asked_for():
    echoed = normalize.without_echo(mask("Could not find [arun date songs]. Similar: ['Indian folk music']"),
                                    '{"query":"arun date songs"}')
    assert echoed == "Could not find [\x01]. Similar: ['Indian folk music']"
    assert normalize.without_echo("Error: a", '{"path":"a"}') == "Error: a"  # too short to be an echo
    assert normalize.without_echo("no such file: src", "src") == "no such file: \x01"  # text arguments as they are
