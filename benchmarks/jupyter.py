"""A real Jupyter server (JupyterLab 4 at /lab, Notebook 7 at /tree and /notebooks) on a free loopback port,
for tests/browser/test_notebook.py and benchmarks/screenshots.py.

    from benchmarks.jupyter import jupyter, output_frames, run_all, write_notebook

It runs with a token, no browser, a root folder of the caller's, and every Jupyter and IPython folder
(config, data: the notebook-signing key and its trust database, runtime, settings, workspaces) in a
temporary folder of its own: nothing from the developer's ~/.jupyter reaches it, and nothing of it stays.
Its kernels import this checkout (PYTHONPATH), as `make run` serves it. JupyterLab's own calls out (the
news feed, the update check) are off: the server reaches nothing past the machine.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.launch import REPO, free_port, stop

START_S = 120  # a cold start of jupyter_server and its extensions on a busy shared machine
POLL_S = 0.2
NO_NEWS = {"fetchNews": "false", "checkForUpdates": False}
OUTPUT_MS = 180_000  # a cold kernel imports torch and loads a model, on a busy shared machine
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


@dataclass(frozen=True)
class Jupyter:
    base: str  # http://127.0.0.1:<port>, no trailing slash
    token: str
    root: Path

    def url(self, path: str) -> str:
        """`path` (e.g. "lab/tree/a.ipynb") on this server, with its token."""
        return f"{self.base}/{path}?token={self.token}"


def _status(base: str, token: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as response:  # noqa: S310
            return bool(response.status == 200)
    except OSError:
        return False


def _config(port: int, token: str, root: Path) -> dict[str, Any]:
    return {
        "ServerApp": {"ip": "127.0.0.1", "port": port, "open_browser": False, "root_dir": str(root)},
        "IdentityProvider": {"token": token},
        # window.jupyterapp: a test runs the notebook's commands (Run All, Save) as the menus do
        "LabApp": {
            "news_url": None,
            "check_for_updates_class": "jupyterlab.NeverCheckForUpdate",
            "expose_app_in_browser": True,
        },
        "JupyterNotebookApp": {"expose_app_in_browser": True},
    }


@contextmanager
def jupyter(root: Path, *, log: Path | None = None, start_s: float = START_S) -> Iterator[Jupyter]:
    """`jupyter lab` serving `root`, up (GET /api/status answers) before it is yielded, stopped after, its
    kernels with it. `log` takes the server's output. Raises RuntimeError when it exits or never answers."""
    port, token = free_port(), secrets.token_hex(16)
    with ExitStack() as stack:
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="headscope-jupyter-")))
        folders = {
            name: home / name
            for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR")
        }
        folders["JUPYTERLAB_SETTINGS_DIR"] = home / "lab-settings"
        folders["JUPYTERLAB_WORKSPACES_DIR"] = home / "lab-workspaces"
        for folder in folders.values():
            folder.mkdir()
        config = folders["JUPYTER_CONFIG_DIR"] / "jupyter_server_config.json"
        config.write_text(json.dumps(_config(port, token, root)))
        # No "get notified about Jupyter news?" toast over the outputs: the user has answered Never.
        news = folders["JUPYTERLAB_SETTINGS_DIR"] / "@jupyterlab" / "apputils-extension"
        news.mkdir(parents=True)
        (news / "notification.jupyterlab-settings").write_text(json.dumps(NO_NEWS))
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, **{k: str(v) for k, v in folders.items()}, "PYTHONPATH": path}
        sink = stack.enter_context(log.open("wb")) if log is not None else None
        # --allow-root: CI and these machines run as root, where jupyter_server refuses to start without it
        command = [sys.executable, "-m", "jupyterlab", "--allow-root"]
        process = subprocess.Popen(
            command, cwd=root, env=env, stdout=sink, stderr=subprocess.STDOUT if sink else None
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + start_s
            while not _status(base, token):
                where = f"; see {log}" if log else ""
                if process.poll() is not None:
                    raise RuntimeError(f"jupyter lab exited with {process.returncode}{where}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"jupyter lab did not answer in {start_s:g} s{where}")
                time.sleep(POLL_S)
            yield Jupyter(base, token, root)
        finally:
            stop(process)


def write_notebook(path: Path, cells: Sequence[str]) -> Path:
    """A notebook of code `cells` (no outputs) with the python3 kernel named, so a front end starts it."""
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = dict(KERNELSPEC)
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    nbformat.write(notebook, path)
    return path


# Waits until the notebook's outputs hold `count` iframes, or one shows a traceback (returned). Not every
# stderr output is one: importing transformers in a kernel without ipywidgets warns (tqdm's TqdmWarning).
OUTPUTS_JS = """(count) => {
  const mime = '[data-mime-type="application/vnd.jupyter.stderr"]';
  const stderr = [...document.querySelectorAll(`.jp-OutputArea-output${mime}`)];
  const error = stderr.find((output) => /\\w+Error\\b/.test(output.textContent));
  if (error) return error.textContent;
  return document.querySelectorAll('.jp-OutputArea-output iframe').length === count;
}"""


def run_all(page: Any) -> None:
    """Run every cell of the notebook open on `page` (JupyterLab or Notebook 7) once its kernel is up, as
    Run > Run All Cells does."""
    page.wait_for_function("() => window.jupyterapp?.shell?.currentWidget?.sessionContext", timeout=60_000)
    page.evaluate("async () => { await window.jupyterapp.shell.currentWidget.sessionContext.ready; }")
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")


def output_frames(page: Any, count: int, *, timeout_ms: float = OUTPUT_MS) -> list[Any]:
    """The frames of the `count` iframes in the notebook's outputs (a JupyterLab, Notebook 7 or nbconvert
    page), once there; AssertionError with the traceback where a cell failed."""
    found = page.wait_for_function(OUTPUTS_JS, arg=count, timeout=timeout_ms).json_value()
    if found is not True:
        raise AssertionError(f"a cell failed: {found}")
    frames = page.locator(".jp-OutputArea-output iframe")
    return [frames.nth(k).element_handle().content_frame() for k in range(count)]
