#!/usr/bin/env python3
"""Screenshot of a DAG run's grid in Airflow 3's UI, taken in headless Chromium.

Usage (against a running ``airflow standalone``; the admin password is in
``$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated``):

    python scripts/airflow_screenshot.py --url http://127.0.0.1:8080 --user admin \\
        --password-file "$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated" \\
        --dag tpcdi_incremental --out docs/images/airflow-grid.png

Why this way: the UI is a React app that authenticates every API call with the JWT in the
``_token`` cookie, which its login form sets from JavaScript; ``chromium --screenshot`` cannot
log in. So the script logs in the way the form does (``POST /auth/token`` with the user's
password), and drives Chromium over the DevTools protocol on a pipe
(``--remote-debugging-pipe``: fd 3 in, fd 4 out, NUL-separated JSON; no port, no extra
package): it sets the cookie, opens the run's page (the grid beside the run's details), waits
until the grid shows every task of the run in its final state, and captures the page.
Standard library only, so it runs from any Python that can reach the server.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

WINDOW = (1500, 820)


def login(url: str, user: str, password: str) -> str:
    """A JWT for ``user`` from the simple auth manager, as the login form gets it."""
    body = json.dumps({"username": user, "password": password}).encode()
    request = urllib.request.Request(f"{url}/auth/token", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return str(json.load(response)["access_token"])


def api(url: str, token: str, path: str) -> Any:
    """GET ``/api/v2/<path>`` with the JWT."""
    request = urllib.request.Request(f"{url}/api/v2/{path}",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


class DevTools:
    """Chromium, headless, driven over ``--remote-debugging-pipe``."""

    def __init__(self, binary: str, profile: Path) -> None:
        to_chrome_r, to_chrome_w = os.pipe()
        from_chrome_r, from_chrome_w = os.pipe()
        # the child's ends moved above fd 10, so that placing them at 3 and 4 clobbers neither
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_chrome_r, from_chrome_w)]
        for fd in (to_chrome_r, from_chrome_w):
            os.close(fd)

        def place() -> None:  # in the child, before exec: Chromium reads fd 3, writes fd 4
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--no-proxy-server", "--hide-scrollbars", "--remote-debugging-pipe",
             f"--user-data-dir={profile}", f"--window-size={WINDOW[0]},{WINDOW[1]}",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            pass_fds=(3, 4), preexec_fn=place, start_new_session=True)
        for fd in high:
            os.close(fd)
        self.send_fd, self.read_fd = to_chrome_w, from_chrome_r
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def _message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self.buffer:
            ready, _, _ = select.select([self.read_fd], [], [], max(0.0, deadline - time.time()))
            if not ready:
                raise TimeoutError("Chromium did not answer over DevTools in time")
            chunk = os.read(self.read_fd, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium exited: " + self.stderr_tail())
            self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        return dict(json.loads(raw))

    def call(self, method: str, session: str | None = None, timeout: float = 60,
             **params: Any) -> dict[str, Any]:
        """One DevTools command; its result (events that arrive meanwhile are kept)."""
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self.send_fd, json.dumps(message).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            reply = self._message(deadline)
            if reply.get("id") != self.next_id:
                self.events.append(reply)
                continue
            if "error" in reply:
                raise RuntimeError(f"{method}: {reply['error']}")
            return dict(reply.get("result", {}))

    def stderr_tail(self) -> str:
        self.process.kill()
        assert self.process.stderr is not None
        return self.process.stderr.read().decode(errors="replace")[-2000:]

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except (OSError, RuntimeError, TimeoutError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for fd in (self.send_fd, self.read_fd):
            os.close(fd)


# the page is ready when every task id of the run is on it and nothing is loading
READY = """(() => {
  const text = document.body ? document.body.innerText : "";
  const tasks = %s;
  const spinning = document.querySelectorAll('[class*="spinner"], .chakra-spinner').length;
  return tasks.every(t => text.includes(t)) && spinning === 0;
})()"""


def screenshot(url: str, token: str, dag: str, run_id: str, tasks: list[str], out: Path,
               timeout: float = 90) -> None:
    """Open the run's page logged in as the token's user; save the page as PNG at ``out``."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if not binary:
        sys.exit("Chromium is needed: apt-get install chromium (scripts/system.sh does)")
    page = f"{url}/dags/{dag}/runs/{urllib.parse.quote(run_id, safe='')}"
    with tempfile.TemporaryDirectory(prefix="airflow-shot-") as profile:
        chrome = DevTools(binary, Path(profile))
        try:
            target = chrome.call("Target.createTarget", url="about:blank")["targetId"]
            session = chrome.call("Target.attachToTarget", targetId=target,
                                  flatten=True)["sessionId"]
            chrome.call("Network.enable", session)
            chrome.call("Network.setCookie", session, name="_token", value=token, url=url,
                        path="/")
            chrome.call("Emulation.setDeviceMetricsOverride", session, width=WINDOW[0],
                        height=WINDOW[1], deviceScaleFactor=1, mobile=False)
            chrome.call("Page.enable", session)
            chrome.call("Page.navigate", session, url=page)
            deadline = time.time() + timeout
            check = READY % json.dumps(tasks)
            while True:
                done = chrome.call("Runtime.evaluate", session, expression=check,
                                   returnByValue=True)["result"].get("value")
                if done:
                    break
                if time.time() > deadline:
                    text = chrome.call("Runtime.evaluate", session,
                                       expression="document.body.innerText",
                                       returnByValue=True)["result"].get("value")
                    raise TimeoutError(f"{page} did not show the run's tasks {tasks} in "
                                       f"{timeout:.0f} s; the page says: {str(text)[:1500]}")
                time.sleep(0.5)
            time.sleep(1.5)  # the grid's cells fade in after the text
            shot = chrome.call("Page.captureScreenshot", session, format="png")["data"]
        finally:
            chrome.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(base64.b64decode(shot))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the API server, e.g. http://127.0.0.1:8080")
    parser.add_argument("--user", default="admin")
    parser.add_argument("--password-file", type=Path, required=True,
                        help="the simple auth manager's generated passwords (JSON)")
    parser.add_argument("--dag", required=True)
    parser.add_argument("--run-id", help="default: the DAG's latest run")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    url = args.url.rstrip("/")
    password = json.loads(args.password_file.read_text())[args.user]
    token = login(url, args.user, password)
    run_id = args.run_id or api(url, token, f"dags/{args.dag}/dagRuns?order_by=-run_after"
                                            "&limit=1")["dag_runs"][0]["dag_run_id"]
    instances = api(url, token, f"dags/{args.dag}/dagRuns/"
                                f"{urllib.parse.quote(run_id, safe='')}/taskInstances")
    tasks = sorted({ti["task_id"] for ti in instances["task_instances"]})
    screenshot(url, token, args.dag, run_id, tasks, args.out)
    print(args.out)


if __name__ == "__main__":
    main()
