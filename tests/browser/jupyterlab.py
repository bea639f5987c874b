"""A throwaway JupyterLab for the browser tests, and the few clicks and waits a learner's session is made of.

The server runs from this interpreter's environment on output-free copies of the lessons, with its config, data,
runtime and workspace folders in a temporary directory: nothing touches the user's home or the repository.
Nothing here imports Playwright, so the tests can skip cleanly where it is missing.
"""
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

CHROMIUM_NAMES = ("chromium", "chromium-browser")
CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/lib/chromium/chromium", "/usr/bin/chromium-browser")
# no sandbox (CI runs as root); no GPU; and none of the connections Chromium makes on its own, which a closed
# network refuses
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
                  "--no-proxy-server", "--disable-default-apps", "--disable-extensions"]
# a notebook opens without news, update checks, or cells virtualised out of the page
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
}
# Timeouts bound a hang on a busy machine; a passing run stays far below them. They are not speed claims.
START_TIMEOUT_S = 60  # the server answering
OPEN_TIMEOUT_MS = 60_000  # JupyterLab's page and a connected kernel
RUN_ALL_TIMEOUT_MS = 90_000  # a whole lesson, while the other one runs beside it
ERROR_OUTPUT = '.jp-Notebook .jp-OutputArea-output[data-mime-type="application/vnd.jupyter.error"]'
# Run All is over when every non-empty code cell shows its execution count, or when a cell has failed
RUN_ALL_DONE = """errorOutput => {
    if (document.querySelector(errorOutput)) return true;
    const cells = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')]
        .filter(cell => cell.querySelector('.cm-content').textContent.trim() !== '');
    return cells.length > 0
        && cells.every(cell => /^\\[\\d+\\]/.test(cell.querySelector('.jp-InputPrompt').textContent.trim()));
}"""


def find_chromium():
    """The system Chromium's executable, or None."""
    for name in CHROMIUM_NAMES:
        if path := shutil.which(name):
            return path
    return next((p for p in CHROMIUM_PATHS if os.access(p, os.X_OK)), None)


class Lab:
    """A JupyterLab subprocess on a free port of 127.0.0.1, serving copies of `notebooks` from `home`.

    Its kernels run `sys.executable`, so they import this environment's kvlesson.
    """

    def __init__(self, home, notebooks):
        root, config = home / "notebooks", home / "config"
        root.mkdir()
        for path in notebooks:
            notebook = json.loads(path.read_text(encoding="utf-8"))
            (root / path.name).write_text(json.dumps(without_outputs(notebook)), encoding="utf-8")
        settings = config / "lab" / "user-settings"
        for plugin, values in LAB_SETTINGS.items():
            (settings / plugin).parent.mkdir(parents=True, exist_ok=True)
            (settings / f"{plugin}.jupyterlab-settings").write_text(json.dumps(values))
        env = dict(os.environ, JUPYTER_CONFIG_DIR=str(config), JUPYTER_DATA_DIR=str(home / "data"),
                   JUPYTER_RUNTIME_DIR=str(home / "runtime"), IPYTHONDIR=str(home / "ipython"))
        self.port, self.token, self.up = free_port(), secrets.token_hex(16), False
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = home / "jupyterlab.log"
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
             f"--port={self.port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
             f"--ServerApp.root_dir={root}", f"--LabApp.user_settings_dir={settings}",
             f"--LabApp.workspaces_dir={home / 'workspaces'}"],
            cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)

    def url(self, notebook):
        """The notebook in a workspace of its own, so that no other tab's state follows it."""
        return f"{self.base}/lab/workspaces/{notebook.split('.')[0]}/tree/{notebook}?token={self.token}"

    def wait_until_up(self):
        no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.up:
            if self.process.poll() is not None:
                pytest.fail(f"JupyterLab exited with code {self.process.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer on {self.base} in {START_TIMEOUT_S} s:\n{self.log_tail()}")
            try:
                with no_proxy.open(f"{self.base}/api/status?token={self.token}", timeout=2):
                    self.up = True
            except OSError:
                time.sleep(0.2)

    def log_tail(self, lines=30):
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self):
        self.process.terminate()  # SIGTERM: the server shuts its kernels down, then exits
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


def without_outputs(notebook):
    """A learner's fresh copy: no outputs and no execution counts, so everything a test reads comes from its run."""
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    return notebook


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_run_all(page):
    """Once the notebook's kernel is up, Run > Run All Cells."""
    kernel_idle(page, OPEN_TIMEOUT_MS)
    menu(page, "Run", "Run All Cells")


def finish_run_all(page):
    """Waits for the last cell of a Run All; fails with the traceback if a cell raised."""
    page.wait_for_function(RUN_ALL_DONE, arg=ERROR_OUTPUT, timeout=RUN_ALL_TIMEOUT_MS, polling=250)
    errors = page.locator(ERROR_OUTPUT)
    if errors.count():
        notebook = page.url.split("/tree/")[-1].split("?")[0]
        pytest.fail(f"a cell of {notebook} failed while running all cells:\n{errors.first.inner_text()}")
    kernel_idle(page)


def menu(page, name, item):
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{name}$")).click()
    page.locator(".lm-Menu-item:visible .lm-Menu-itemLabel", has_text=re.compile(f"^{re.escape(item)}$")).click()


def kernel_idle(page, timeout=None):
    """Waits for the status bar's 'Python 3 (ipykernel) | Idle': connected and idle. (The notebook toolbar says
    idle before the kernel has even started.)"""
    page.locator(".jp-StatusBar-Item", has_text=re.compile(r"\|\s*Idle$")).wait_for(timeout=timeout)
