"""What JupyterLab saves of a course notebook: what the course wrote and what the student typed, never a run's
outputs.

`make lab` and `make instructor` start JupyterLab with `CourseContentsManager` (set in
`jupyter/*/jupyter_server_config.json`). For a notebook under `lessons/` or `labs/` it removes what running
cells adds (outputs, execution counts, widget state, timing and scroll marks, the kernel's language details)
before saving, keeps the stored kernel metadata (JupyterLab writes the running kernel's own display name), and
writes nothing at all when what is left equals the notebook on disk. A student's checkout therefore stays
clean (`git status`) and `git pull` keeps bringing course updates however often the lessons are run; a
student's own edits (a lab's solutions) are saved as usual. The outputs stay on screen until the notebook is
closed.
"""

from __future__ import annotations

import copy
import json

import nbformat
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager

COURSE_FOLDERS = ("lessons/", "labs/")
# Cell metadata that JupyterLab adds while running or viewing a cell (never part of the course).
RUN_CELL_METADATA = ("execution", "ExecuteTime", "scrolled", "collapsed", "trusted")


def is_course_notebook(path: str) -> bool:
    """Whether `path` (relative to the server's root) is a notebook of the course (lessons/ or labs/)."""
    path = path.strip("/")
    return path.endswith(".ipynb") and path.startswith(COURSE_FOLDERS)


def strip_run(notebook: dict) -> dict:
    """A copy of `notebook` (nbformat 4 JSON as a dict) without what running it added: outputs, execution
    counts, the `widgets` state, cell timing / scroll / collapse marks, and the kernel's language details
    beyond the language's name."""
    notebook = copy.deepcopy(notebook)
    metadata = notebook.setdefault("metadata", {})
    metadata.pop("widgets", None)
    if isinstance(metadata.get("language_info"), dict):
        metadata["language_info"] = {"name": metadata["language_info"].get("name", "python")}
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"], cell["execution_count"] = [], None
        cell_metadata = cell.setdefault("metadata", {})
        for key in RUN_CELL_METADATA:
            cell_metadata.pop(key, None)
        jupyter = cell_metadata.get("jupyter")
        if isinstance(jupyter, dict):
            jupyter.pop("outputs_hidden", None)
            if not jupyter:
                del cell_metadata["jupyter"]
    return notebook


def normal_form(notebook: dict) -> dict:
    """`notebook` as nbformat reads it (cell sources as one string each, as JupyterLab sends them; a file stores
    them as lists of lines), so that two notebooks compare equal when they hold the same content."""
    return json.loads(json.dumps(nbformat.reads(json.dumps(notebook), as_version=nbformat.NO_CONVERT)))


def keep_kernel_metadata(notebook: dict, stored: dict) -> dict:
    """`notebook` with the stored notebook's `kernelspec` and `language_info` when it runs the same kernel:
    JupyterLab writes what the running kernel reports (e.g. display name "Python 3 (ipykernel)" for the
    course's "Python 3"), which is not a change anybody made."""
    kernel = notebook.get("metadata", {}).get("kernelspec")
    stored_kernel = stored.get("metadata", {}).get("kernelspec")
    if not (isinstance(kernel, dict) and isinstance(stored_kernel, dict)) or kernel.get("name") != stored_kernel.get(
            "name"):
        return notebook
    metadata = {**notebook["metadata"], "kernelspec": stored_kernel}
    if "language_info" in stored.get("metadata", {}):
        metadata["language_info"] = stored["metadata"]["language_info"]
    return {**notebook, "metadata": metadata}


class CourseContentsManager(AsyncLargeFileManager):
    """Jupyter's file manager, saving course notebooks without their runs (see the module docstring)."""

    async def save(self, model: dict, path: str = "") -> dict:
        path = path.strip("/")
        if model.get("type") == "notebook" and model.get("content") is not None and is_course_notebook(path):
            content = strip_run(json.loads(json.dumps(model["content"])))
            stored = self._stored(path)
            if stored is not None:
                content = keep_kernel_metadata(content, stored)
                if normal_form(strip_run(stored)) == normal_form(content):
                    return await self.get(path, content=False)  # nothing the course or the student wrote changed
            model = {**model, "content": content}
        return await super().save(model, path)

    def _stored(self, path: str) -> dict | None:
        """The notebook at `path` as stored on disk (None when there is none or it is not valid JSON)."""
        try:
            with open(self._get_os_path(path), encoding="utf-8") as file:
                return json.load(file)
        except (OSError, ValueError):
            return None
