"""A condition no retry can change, and an agent doing nothing again and again.

- New calls (the next file to download) each meeting an error that says every further attempt fails alike (a quota
  used up, a permission revoked, a rate limit exhausted): no exploration, but weak evidence, since the calls differ:
  warned on, stopped only with the judge's word or once the calls become identical.
- A coding CLI's shell calls that do nothing (an empty command, `true`, an `echo` of one word, a placeholder), and a
  program that does not exist run through the shell with varied arguments (Codex CLI's plan tool, run as a command).
"""

from __future__ import annotations

import orjson
import pytest

from proxy.detect.engine import Decision, DetectConfig, episodes
from proxy.detect.judge_policy import JudgeCheck
from proxy.detect.texts import warning_text
from proxy.detect.tools import does_nothing, is_standing
from tests.convo import analyze, conversation, step, user

DEFAULT = DetectConfig()
LENIENT = DetectConfig(tool_call_threshold=5)


def found(messages, config=DEFAULT):
    state, _ = analyze(config, messages)
    return [(e.type, e.detail["strength"], e.is_stop) for e in episodes(config, state)]


# -- a condition no retry can change ----------------------------------------------------------------------------

QUOTA = ("Error: 403 Client Error: Forbidden for url: https://huggingface.co/api/datasets/acme/corpus/resolve/main/"
         "{path}. Download quota exceeded: you have no downloads left for today. All further download requests "
         "will be refused until your quota resets at 00:00 UTC.")
FILES = ["data/images.tar", "data/labels.csv", "data/captions.jsonl", "README.md", "data/metadata.parquet",
         "data/splits.json", "data/licenses.txt"]


def downloads(files, listing=True):
    parts = [user("Download the acme/corpus dataset into ./data and check the label counts.")]
    for path in files:
        if listing:  # the agent looks before each download: each look succeeds
            parts += step("list_repo_files", {"repo_id": "acme/corpus", "repo_type": "dataset"},
                          "\n".join(FILES))
        parts += step("hf_download", {"repo_id": "acme/corpus", "filename": path}, QUOTA.format(path=path))
    return conversation(*parts)


def test_the_quota_error_says_no_retry_can_change_it():
    assert is_standing("download quota exceeded: you have no downloads left for today")
    assert is_standing("Error: 401 Unauthorized: your access token has been revoked")
    assert is_standing("Error code: 429 - You exceeded your current quota, please check your plan and billing")
    assert not is_standing("Error: file data/images.tar not found in acme/corpus")
    assert not is_standing("Error: connection reset by peer")


@pytest.mark.parametrize("config", [DEFAULT, LENIENT], ids=["default", "lenient"])
def test_new_downloads_each_refused_by_the_used_up_quota_warn_and_never_stop(config):
    result = found(downloads(FILES), config)
    assert result and all(kind == "tool_error" and strength == "weak" and not stop
                          for kind, strength, stop in result)
    state, _ = analyze(config, downloads(FILES))
    assert Decision(episodes(config, state)).stop is None
    assert "hf_download" in warning_text(episodes(config, state)[0])
    assert "no downloads left" in episodes(config, state)[0].evidence.error


def test_new_downloads_numbered_alike_are_still_new_calls_meeting_the_wall():
    shards = [f"data/train-{n:05d}-of-00012.parquet" for n in range(6)]
    assert {strength for _, strength, _ in found(downloads(shards, listing=False))} == {"weak"}


def test_the_quota_loop_stops_with_the_judges_word():
    state, _ = analyze(DEFAULT, downloads(FILES))
    agreed = JudgeCheck(state.key, 3, 0.95, analysis="every download is refused by the quota")
    assert any(e.is_stop for e in episodes(DEFAULT, state, judge_checks=[agreed]))


def test_the_quota_loop_stops_once_the_same_download_is_tried_again_and_again():
    messages = downloads(FILES[:3] + [FILES[2]] * 3)
    result = found(messages)
    assert result[-1][1:] == ("strong", True)


def test_new_calls_each_failing_differently_stay_exploration():
    parts = [user("Download the acme/corpus dataset.")]
    for path in FILES:
        parts += step("list_repo_files", {"repo_id": "acme/corpus"}, "\n".join(FILES))
        parts += step("hf_download", {"repo_id": "acme/corpus", "filename": path},
                      f"Error: 404 Client Error: Entry Not Found for url: https://huggingface.co/{path}")
    assert found(conversation(*parts)) == []


# -- doing nothing, again and again ------------------------------------------------------------------------------

def codex_shell(output: str, code: int = 0) -> str:
    return (f"Chunk ID: 3fa2c1\nWall time: 0.0041 seconds\nProcess exited with code {code}\n"
            f"Original token count: {len(output) // 4}\nOutput:\n{output}")


def exec_command(cmd: str, output: str, code: int = 0) -> list[dict]:
    return step("exec_command", {"cmd": cmd, "workdir": "/home/usaco/CSES/1069"}, codex_shell(output, code))


IDLE = [("echo 'plan'", "plan\n"), ("true", ""), ("echo '??'", "??\n"), ("", ""), ("echo", "\n"),
        ("<command>", ""), ("echo 'ok'", "ok\n")]


def test_what_does_nothing():
    assert all(does_nothing("exec_command", orjson.dumps({"cmd": cmd}).decode()) for cmd, _ in IDLE)
    assert does_nothing("shell", orjson.dumps({"command": ["bash", "-lc", "cd /app && true"]}).decode())
    for busy in ("ls", "pwd", "echo 'Running the tests now' && pytest -q", "cat a.txt", "echo hi > out.txt",
                 "python solve.py"):
        assert not does_nothing("exec_command", orjson.dumps({"cmd": busy}).decode())


def test_a_task_opened_by_five_calls_that_do_nothing_is_warned_and_never_stopped():
    parts = [user("Solve CSES 1069 (Repetitions) in C++ and test it on the samples.")]
    for cmd, output in IDLE:
        parts += exec_command(cmd, output)
    result = found(conversation(*parts))
    assert result == [("tool_call", "weak", False)] * 3  # the 5th, 6th and 7th
    state, _ = analyze(DEFAULT, conversation(*parts))
    assert "did nothing" in warning_text(episodes(DEFAULT, state)[0])
    assert found(conversation(*parts[:11]), LENIENT) == [("tool_call", "weak", False)]


def test_calls_that_do_nothing_between_work_are_nothing():
    parts = [user("Solve CSES 1069.")]
    for (cmd, output), work in zip(IDLE, ["ls", "cat main.cpp", "g++ -O2 main.cpp -o main", "./main < in1.txt",
                                          "./main < in2.txt", "cat in3.txt", "./main < in3.txt"]):
        parts += exec_command(cmd, output) + exec_command(work, "done\n")
    assert found(conversation(*parts)) == []


PLAN = '{"plan": [{"step": "Read the problem", "status": "in_progress"}, {"step": "Write solution", "status": "pending"}]}'
NOT_FOUND = "/bin/bash: line 1: update_plan: command not found\n"


def test_a_program_that_does_not_exist_run_with_varied_arguments_is_one_call_failing_alike():
    parts = [user("Solve CSES 1069 (Repetitions) in C++.")]
    for args, work in [(f"update_plan '{PLAN}'", "ls"), ("update_plan", "cat README.md"),
                       ("update_plan --help", "ls tests"), (f"update_plan --plan '{PLAN}'", "pwd"),
                       ("update_plan -", "ls -la")]:
        parts += exec_command(args, NOT_FOUND, 127) + exec_command(work, "main.cpp README.md tests\n")
    result = found(conversation(*parts))
    # The program never ran, whatever it was given: the same call failing the same way, strong.
    assert result[:3] == [("tool_error", "strong", False), ("tool_error", "strong", False),
                          ("tool_error", "strong", True)]
    state, _ = analyze(DEFAULT, conversation(*parts))
    assert "command not found" in warning_text(episodes(DEFAULT, state)[0])
