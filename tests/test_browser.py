"""The panel in a real browser: JupyterLab + headless Chromium run 01_quickstart.ipynb end to end.

Checks what only a browser can: the widgets and the offline altair chart render (no "Error
displaying widget", no JavaScript error), a knob changed in the page starts a trial, the chart
gains a mark and the table a row, Stop interrupts a running trial. Prints two latencies seen in
the browser (knob change -> trial running, trial end -> new chart mark) and saves a screenshot.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
NOTEBOOK = "01_quickstart.ipynb"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
RUN_ALL_TIMEOUT_MS = 600_000  # the notebook takes ~1.5 min here; leave room for a busy machine
TRIAL_TIMEOUT_MS = 180_000
RUNNING = ["starting", "loading data", "starting workers", "compiling", "warming up", "measuring", "done"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} not installed (apt install chromium)"),
]

# JavaScript run in the page: timestamps (performance.now(), ms) of what the panel shows.
WATCH_JS = """
() => {
  const panel = () => document.querySelector('.wb-panel');
  const phase = () => panel()?.querySelector('.wb-status')?.dataset.phase ?? '';
  const marks = () => panel()?.querySelectorAll('.wb-chart g.mark-symbol.role-mark path').length ?? 0;
  const rows = () => panel()?.querySelectorAll('table.wb-results tbody tr').length ?? 0;
  const w = window.__wb = {t0: performance.now(), marks0: marks(), rows0: rows(), running: null, done: null,
                           mark: null, row: null, phases: []};
  const running = new Set(RUNNING_PHASES);
  const tick = () => {
    const now = performance.now(), p = phase();
    if (w.phases[w.phases.length - 1] !== p) w.phases.push(p);
    if (w.running === null && running.has(p) && p !== 'done') w.running = now;
    if (w.running !== null && w.done === null && !running.has(p)) w.done = now;  // status left the running phases
    if (w.running !== null && w.done === null && p === 'done') w.done = now;    // run_trial's final report
    if (w.mark === null && marks() > w.marks0) w.mark = now;
    if (w.row === null && rows() > w.rows0) w.row = now;
    if (w.mark === null || w.row === null || w.done === null) requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
}
""".replace("RUNNING_PHASES", json.dumps(RUNNING))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path):
    """A throw-away JupyterLab on 127.0.0.1 serving a copy of the notebook; yields its base URL + token."""
    work = tmp_path / "notebooks"
    work.mkdir()
    shutil.copy(ROOT / "notebooks" / NOTEBOOK, work / NOTEBOOK)
    settings = tmp_path / "settings"
    for plugin, values in {
        "docmanager-extension/plugin": {"autosave": False},
        "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
        "notebook-extension/tracker": {"windowingMode": "none"},  # every cell in the DOM, for the checks
    }.items():
        path = settings / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "IPYTHONDIR": str(tmp_path / "ipython"), "PYTHONPATH": str(ROOT),
           "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR", str(ROOT / ".inductor-cache"))}
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           f"--IdentityProvider.token={token}", "--ServerApp.allow_root=True", "--LabApp.extension_manager=readonly",
           f"--ServerApp.root_dir={work}", f"--LabApp.user_settings_dir={settings}",
           f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}", "--LabApp.expose_app_in_browser=True",
           "--ServerApp.open_browser=False"]
    log = open(tmp_path / "jupyter.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"JupyterLab did not start:\n{(tmp_path / 'jupyter.log').read_text()[-3000:]}") from None
                time.sleep(0.5)
        yield base, token
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and the kernels it started
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def test_quickstart_panel_in_a_real_browser(lab, tmp_path) -> None:
    from playwright.sync_api import sync_playwright

    base, token = lab
    started = time.monotonic()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 2000})
            page = context.new_page()
            js_errors: list[str] = []
            page.on("pageerror", lambda e: js_errors.append(str(e)))
            page.goto(f"{base}/lab/tree/{NOTEBOOK}?token={token}")

            # ---- run the notebook top to bottom -------------------------------------------------
            page.get_by_text("(ipykernel) | Idle").wait_for(timeout=120_000)
            page.evaluate("() => window.jupyterapp.commands.execute('runmenu:run-all')")
            page.locator(".jp-OutputArea-output", has_text="notebook ran in").wait_for(timeout=RUN_ALL_TIMEOUT_MS)
            page.get_by_text("(ipykernel) | Idle").wait_for(timeout=60_000)
            run_all_s = time.monotonic() - started

            body = page.inner_text("body")
            assert "Error displaying widget" not in body
            assert "Javascript Error" not in body and "Traceback" not in body, body[-3000:]
            panel = page.locator(".wb-panel")
            assert panel.count() == 1
            panel.scroll_into_view_if_needed()
            marks = panel.locator(".wb-chart g.mark-symbol.role-mark path")
            rows = panel.locator("table.wb-results tbody tr")
            page.wait_for_function("() => document.querySelectorAll('.wb-panel .wb-chart svg').length > 0")
            n_marks, n_rows = marks.count(), rows.count()
            # the notebook's ten trials: baseline, cached, 2 confirmation rounds (4), the baseline again,
            # workers, workers + cpu_threads=1, and the panel's own trial
            assert n_marks == n_rows == 10, (n_marks, n_rows)
            assert panel.locator(".wb-knob-pin_memory input").is_disabled()  # a no-op on CPU

            # ---- change num_workers in the page: a trial runs, a mark and a row appear ---------
            page.evaluate(WATCH_JS)
            readout = panel.locator(".wb-knob-num_workers .widget-readout")
            readout.click()
            page.keyboard.press("Control+A")
            page.keyboard.type("1")
            t_change = page.evaluate("() => performance.now()")
            page.keyboard.press("Enter")
            page.wait_for_function("() => window.__wb.mark !== null && window.__wb.row !== null && window.__wb.done !== null",
                                   timeout=TRIAL_TIMEOUT_MS)
            w = page.evaluate("() => window.__wb")
            assert w["running"] is not None, w["phases"]
            assert marks.count() == n_marks + 1 and rows.count() == n_rows + 1
            assert "num_workers=1" in rows.first.inner_text()
            change_to_running_s = (w["running"] - t_change) / 1e3
            end_to_mark_s = (w["mark"] - w["done"]) / 1e3

            # ---- Stop during a run: recorded as interrupted -------------------------------------
            panel.locator(".wb-run").click()
            page.wait_for_function("() => ['warming up', 'measuring', 'starting workers'].includes("
                                   "document.querySelector('.wb-panel .wb-status').dataset.phase)", timeout=TRIAL_TIMEOUT_MS)
            panel.locator(".wb-stop").click()
            page.wait_for_function("() => document.querySelector('.wb-panel .wb-status').dataset.phase === 'interrupted'",
                                   timeout=TRIAL_TIMEOUT_MS)
            page.wait_for_function(f"() => document.querySelectorAll('.wb-panel table.wb-results tbody tr').length === {n_rows + 2}")
            assert "interrupted" in rows.first.inner_text()
            assert marks.count() == n_marks + 2  # the interrupted trial is a cross on the zero line

            shot = tmp_path / "panel.png"
            panel.screenshot(path=str(shot))
            assert shot.stat().st_size > 10_000
            assert not js_errors, js_errors
        finally:
            browser.close()
    print(f"\nbrowser test: run-all {run_all_s:.0f} s, total {time.monotonic() - started:.0f} s; "
          f"knob change -> trial running {change_to_running_s:.2f} s (includes the panel's debounce, 0.2 s by default); "
          f"trial end -> chart mark {end_to_mark_s:.2f} s; screenshot {shot}")
