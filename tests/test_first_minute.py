"""The first minute, as a newcomer has it: `make serve` on a fresh clone answers `/healthz` soon, and is never
silent for long while it installs."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path


from tests.test_log_api import _free_port

ROOT = Path(__file__).resolve().parents[1]
# Generous: about 20 s here once packages are downloaded; a slow disk or a cold package cache takes longer.
READY_WITHIN_S = 300
SILENT_AT_MOST_S = 60


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as answer:
            return answer.status == 200
    except OSError:
        return False


def test_make_serve_on_a_fresh_clone_is_ready_soon_and_never_silent_for_long(tmp_path):
    clone = tmp_path / "loopwarden"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
    port = _free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("LOOPWARDEN_")}
    env["LOOPWARDEN_PORT"] = str(port)
    began = time.monotonic()
    lines: list[tuple[float, str]] = []
    process = subprocess.Popen(["make", "serve"], cwd=clone, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def read() -> None:
        for line in process.stdout:
            lines.append((time.monotonic() - began, line.rstrip()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while not _healthy(port):
            assert process.poll() is None, "make serve ended: " + "\n".join(text for _, text in lines[-20:])
            assert time.monotonic() - began < READY_WITHIN_S, f"not ready in {READY_WITHIN_S} s"
            time.sleep(0.5)
        ready = time.monotonic() - began
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
        reader.join(timeout=10)
        process.stdout.close()
    stamps = [0.0] + [at for at, _ in lines] + [ready]
    silence = max(later - earlier for earlier, later in zip(stamps, stamps[1:]))
    told = [text for _, text in lines]
    assert silence < SILENT_AT_MOST_S, f"{silence:.0f} s without a line of output"
    assert any(".venv/bin/loopwarden sessions" in text for text in told)  # how to reach the CLI
    assert any("loopwarden listening on" in text for text in told)
    print(f"make serve on a fresh clone: ready in {ready:.1f} s, the longest silence {silence:.1f} s")
