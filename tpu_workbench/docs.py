"""``tpu-workbench docs``: export every notebook, with its outputs, into a static site that
works with no internet.

Each notebook is run and exported by ``marimo export html``; a page whose session data records an
error (``export html`` exits 0 on some render failures, so its exit code is not enough), or that
shows a failed run (a ``tpu_workbench.notebook.failed_run_callout``: the notebooks catch a run's
failure and show it instead of raising), fails the build. By default the pages load marimo's
frontend from a CDN; the site here copies marimo's own bundled assets next to the pages and
points the pages at them instead, so the site opens offline (it must be served over HTTP:
browsers block module scripts on ``file://``).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .errors import SpecError
from .notebook import FRESH_ENV, WAITS
from .notebook.tables import STATIC_TABLE

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def notebooks(folder: Path = NOTEBOOKS) -> list[Path]:
    """The marimo notebooks in `folder`, quickstart first."""
    found = sorted(p for p in folder.glob("*.py") if "marimo.App(" in p.read_text())
    return sorted(found, key=lambda p: (p.stem != "quickstart", p.stem))


def app_title(path: Path) -> str:
    match = re.search(r'app_title\s*=\s*"([^"]+)"', path.read_text())
    return match.group(1) if match else path.stem


def _markdown_strings(path: Path) -> list[str]:
    """The text of every ``mo.md(...)`` call in a notebook, in source order (for an f-string,
    its literal parts, with ``…`` where a value is filled in)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "md" and node.args):
            continue
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            found.append((arg.lineno, arg.value))
        elif isinstance(arg, ast.JoinedStr):
            found.append((arg.lineno, "".join(
                v.value if isinstance(v, ast.Constant) else "…" for v in arg.values)))
    return [text for _, text in sorted(found)]


def app_summary(path: Path) -> str:
    """The first paragraph of prose after the ``# Title`` of the notebook's first markdown cell,
    rendered from markdown to HTML (inline: no enclosing ``<p>``), for the index page."""
    import textwrap

    import markdown

    for text in _markdown_strings(path):
        lines = textwrap.dedent(text).strip("\n").splitlines()
        if not lines or not lines[0].startswith("# "):
            continue
        paragraph: list[str] = []
        for line in lines[1:]:
            if line.strip():
                paragraph.append(line.strip())
            elif paragraph:
                break
        rendered = markdown.markdown(" ".join(paragraph)).strip()
        return re.sub(r"^<p>(.*)</p>$", r"\1", rendered, flags=re.S)
    return ""


def page_summary(page: str) -> str | None:
    """The first paragraph under the ``# Title`` of an exported page, as the page renders it
    (its values filled in), with its inline math (marimo's ``<marimo-tex>``, drawn by the
    page's own KaTeX) as MathML, which a browser draws with no script: for the index. None
    where the page has no such paragraph."""
    from latex2mathml.converter import convert

    for cell in _session_cells(page):
        for out in cell.get("outputs", []):
            for markup in _strings(out.get("data", "")):
                found = re.search(r"</h1>\s*<span class=\"paragraph\">(.*?)</span>", markup, re.S)
                if found is None:
                    continue
                text = re.sub(r"<marimo-tex[^>]*>\|\|[(\[](.*?)\|\|[)\]]</marimo-tex>",
                              lambda m: convert(html.unescape(m.group(1))), found.group(1),
                              flags=re.S)
                return " ".join(text.split())
    return None


def _decoded(text: str) -> str:
    """`text` with the layers of HTML-attribute and JSON escaping marimo wraps nested outputs
    in (a callout inside a vstack...) undone."""
    for _ in range(8):
        new = html.unescape(text)
        new = re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), new)
        new = new.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        if new == text:
            break
        text = new
    return text


def failed_runs(data: object) -> list[str]:
    """What follows each failed-run marker (``tpu_workbench.notebook.RUN_FAILED``, written by
    ``failed_run_callout``) in a cell's output data, as plain text."""
    from .notebook import RUN_FAILED

    raw = json.dumps(data)
    if RUN_FAILED not in raw:
        return []
    found = []
    for chunk in _decoded(raw).split(RUN_FAILED)[1:]:
        line = re.split(r"</p>|<pre|\n", chunk, maxsplit=1)[0]
        line = re.sub(r"</?(?:strong|code|em|span|p|div)\b[^>]*>", "", line)
        found.append(" ".join(line.split())[:500] or "(no message)")
    return found




def _waiting_text(data: object) -> str:
    """The words of the waiting callout in a cell's output data, as plain text."""
    text = _decoded(json.dumps(data)).split(WAITS)[0].rsplit("data-html=", 1)[-1]
    text = re.sub(r"<[^>]*(>|$)", " ", text).strip(" '\"")
    return " ".join(text.split())[-300:]


def _session_cells(page: str) -> list[dict]:
    """The cells of the session snapshot a page written by ``marimo export html`` embeds."""
    start = page.index('"__MARIMO_MOUNT_CONFIG__"')
    start = page.index("Object.freeze(", start) + len("Object.freeze(")
    config, _ = json.JSONDecoder().raw_decode(page[start:])
    return config["session"]["cells"]


def _text_in(markup: str) -> str:
    """The words of HTML `markup` as a reader sees them, including the HTML that layout
    elements (stacks, callouts, tabs) carry in their attributes; tables' data left out."""
    from html.parser import HTMLParser

    words: list[str] = []

    class Text(HTMLParser):
        def handle_starttag(self, tag, attrs):
            for name, value in attrs:
                if name in ("data-html", "data-label") and value:
                    try:
                        inner = json.loads(value)
                    except ValueError:
                        continue
                    words.extend(_text_in(t) for t in _strings(inner) if t)

        def handle_data(self, data):
            words.append(data)

    Text().feed(markup)
    return " ".join(" ".join(words).split())


def exported_text(page: str) -> str:
    """Every output of an exported page as plain text, in cell order (what a reader reads)."""
    texts = []
    for cell in _session_cells(page):
        for out in cell.get("outputs", []):
            data = out.get("data")
            texts += [_text_in(m) for m in _strings(data.get("text/html") or
                                                      data.get("text/markdown") or ""
                                                      if isinstance(data, dict) else data)]
    return "\n".join(t for t in texts if t)


def _tables_in(markup: str, found: dict[str, list[dict]]) -> None:
    """Add the ``<marimo-table>`` elements of HTML `markup` to `found`, {label: rows}, looking
    inside the HTML that layout elements (stacks, callouts, tabs) carry in their attributes."""
    from html.parser import HTMLParser

    def loads(value: str):
        try:
            return json.loads(value)
        except ValueError:
            return None

    class Tables(HTMLParser):
        static: dict | None = None  # a plain HTML table being read (notebook.static_table)

        def handle_starttag(self, tag, attrs):
            values = dict(attrs)
            if tag == "table" and STATIC_TABLE in values:
                self.static = {"label": values[STATIC_TABLE], "rows": [], "cell": None}
                return
            if self.static is not None:
                if tag == "tr":
                    self.static["rows"].append([])
                elif tag in ("td", "th"):
                    self.static["cell"] = []
                return
            if tag == "marimo-table" and values.get("data-data"):
                rows = loads(values["data-data"])
                rows = loads(rows) if isinstance(rows, str) else rows
                label = loads(values.get("data-label") or '""') or ""
                name = " ".join(re.sub(r"<[^>]*>", "", str(label)).split())
                if isinstance(rows, list):
                    found[name or f"table {len(found) + 1}"] = rows
                return
            for value in values.values():
                inner = loads(value) if value and value[:1] in "\"[{" else None
                for text in _strings(inner):
                    if "<" in text:
                        _tables_in(text, found)

        def handle_data(self, data):
            if self.static is not None and self.static["cell"] is not None:
                self.static["cell"].append(data)

        def handle_endtag(self, tag):
            table = self.static
            if table is None:
                return
            if tag in ("td", "th") and table["cell"] is not None:
                table["rows"][-1].append(_number("".join(table["cell"]).strip()))
                table["cell"] = None
            elif tag == "table":
                header, *rows = table["rows"] or [[]]
                name = " ".join(re.sub(r"<[^>]*>", "", table["label"]).split())
                found[name or f"table {len(found) + 1}"] = [
                    dict(zip(header, row, strict=False)) for row in rows]
                self.static = None

    Tables().feed(markup)


def _number(text: str) -> object:
    """A static table's cell as the number it shows (``1,234.5``), else its text."""
    plain = text.replace(",", "")
    for kind in (int, float):
        try:
            return kind(plain)
        except ValueError:
            pass
    return text


def _strings(value: object) -> list[str]:
    """Every string inside a JSON value (a layout's children: one HTML string, or a list)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    return []


def exported_tables(page: str) -> dict[str, list[dict]]:
    """The tables (``mo.ui.table``) of an exported page, {label: rows}: the numbers a reader
    sees beside the page's sentences."""
    tables: dict[str, list[dict]] = {}
    for cell in _session_cells(page):
        for out in cell.get("outputs", []):
            data = out.get("data")
            for markup in _strings(data.get("text/html") if isinstance(data, dict) else data):
                _tables_in(markup, tables)
    return tables


def _heading(data: object) -> str | None:
    """The text of the last heading (h1-h3) in a cell's output data, if it has one."""
    found = re.findall(r"<h[1-3][^>]*>(.*?)</h[1-3]>", _decoded(json.dumps(data)), re.S)
    return " ".join(re.sub(r"<[^>]*>", "", found[-1]).split()) if found else None


def exported_problems(page: str) -> list[str]:
    """Error outputs and tracebacks recorded in a page written by ``marimo export html``,
    every failed run a notebook showed with ``tpu_workbench.notebook.failed_run_callout``, and
    every section still waiting for a click; each names its cell and the section (the heading
    above it) it is in."""
    problems = []
    section = None
    for cell in _session_cells(page):
        for out in cell.get("outputs", []):
            section = _heading(out.get("data", "")) or section
        where = f"cell {cell['id']}" + (f" (section '{section}')" if section else "")
        for out in cell.get("outputs", []):
            if out.get("type") == "error" and out.get("ename") == "ancestor-stopped":
                # marimo's "Ancestor stopped" box: a waiting section must say in words what it
                # waits for (notebook.Sections), never stop the cells below it
                problems.append(f"{where}: marimo's 'Ancestor stopped' box (a cell above it "
                                "called mo.stop)")
                continue
            if WAITS in _decoded(json.dumps(out.get("data", ""))):
                problems.append(f"{where}: a section waits for a click instead of showing "
                                f"its answer: {_waiting_text(out.get('data', ''))}")
            if out.get("type") == "error":
                problems.append(f"{where}: {out.get('ename')}: {out.get('evalue')}")
            elif "Your output is too large" in json.dumps(out.get("data", "")):
                problems.append(f"{where}: output exceeded runtime.output_max_bytes")
            problems += [f"{where}: run failed: {what}"
                         for what in failed_runs(out.get("data", ""))]
        for con in cell.get("console", []):
            if con.get("mimetype") == "application/vnd.marimo+traceback":
                problems.append(f"{where}: traceback in its console")
    return problems


def cdn_prefix() -> str:
    import marimo

    return f"https://cdn.jsdelivr.net/npm/@marimo-team/frontend@{marimo.__version__}/dist"


def export(notebook: Path, out: Path, smoke: bool, timeout: float = 1200) -> list[str]:
    """Run and export one notebook to `out`; return the problems found (empty when fine)."""
    env = {**os.environ, FRESH_ENV: "1"}  # a published page shows runs measured for it
    if smoke:
        env["TPU_WORKBENCH_SMOKE"] = "1"
    tmp = out.with_suffix(".html.tmp")
    cmd = [sys.executable, "-m", "marimo", "-y", "export", "html", "--no-sandbox",
           str(notebook), "-o", str(tmp), "-f"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [f"export did not finish within {timeout:.0f} s"]
    if not tmp.exists():
        return [f"marimo export failed (exit {proc.returncode}): {proc.stderr[-2000:]}"]
    page = tmp.read_text(encoding="utf-8")
    problems = exported_problems(page)
    if proc.returncode != 0 and not problems:
        problems.append(f"marimo export exited {proc.returncode}: {proc.stderr[-2000:]}")
    tmp.replace(out)
    return problems


def make_offline(site: Path, pages: list[Path]) -> None:
    """Serve marimo's frontend from the site itself instead of the CDN."""
    import marimo

    prefix = cdn_prefix()
    for page in pages:
        page.write_text(page.read_text(encoding="utf-8").replace(prefix, "./_marimo"),
                        encoding="utf-8")
    target = site / "_marimo"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(Path(marimo.__file__).parent / "_static", target,
                    ignore=shutil.ignore_patterns("index.html", "*.md"))


def write_index(site: Path, entries: list[tuple[Path, str, str]]) -> Path:
    """The site's index: a link per page, with its summary (HTML, from :func:`app_summary`)."""
    items = "\n".join(
        f'  <li><a href="{html.escape(page.name)}">{html.escape(title)}</a>'
        f"<p>{summary}</p></li>" for page, title, summary in entries)
    index = site / "index.html"
    index.write_text(f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tpu-workbench notebooks</title>
<style>body{{font-family:system-ui,sans-serif;max-width:760px;margin:3rem auto;padding:0 1rem}}
li{{margin:1rem 0}} p{{margin:.2rem 0;color:#555}}</style></head>
<body><h1>tpu-workbench notebooks</h1>
<p>PyTorch on TPUs, measured: eager vs compiled, HLO, sharding and profiles, exported with
their outputs from a real run ({time.strftime('%Y-%m-%d')}).</p>
<ul>
{items}
</ul></body></html>
""", encoding="utf-8")
    return index


def build_site(out: Path, smoke: bool = False, offline: bool = True,
               folder: Path = NOTEBOOKS, only: list[str] | None = None,
               jobs: int = 1) -> dict[str, list[str]]:
    """Export the notebooks into `out`, `jobs` at a time; return {notebook: problems} (all
    empty on success). Each export is its own process tree, mostly waiting on worker start-up,
    so two at a time pay off even on two cores."""
    nbs = notebooks(folder)
    if only:
        unknown = sorted(set(only) - {p.stem for p in nbs})
        if unknown:
            raise SpecError(f"unknown notebook(s) {unknown}; valid: {[p.stem for p in nbs]}")
        nbs = [p for p in nbs if p.stem in only]
    if not nbs:
        raise SpecError(f"no marimo notebooks in {folder}")
    from .environment.paths import writable_folder

    if not isinstance(jobs, int) or jobs < 1:
        raise SpecError(f"jobs must be a positive int, got {jobs!r}")
    site = writable_folder(out)

    def one(nb: Path) -> list[str]:
        t0 = time.perf_counter()
        problems = export(nb, site / f"{nb.stem}.html", smoke)
        status = "ok" if not problems else "FAILED: " + "; ".join(problems)[:400]
        print(f"  {nb.name:<28} {time.perf_counter() - t0:6.1f} s  {status}", flush=True)
        return problems

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = dict(zip([nb.name for nb in nbs], pool.map(one, nbs), strict=True))
    entries = [(site / f"{nb.stem}.html", app_title(nb),
                page_summary((site / f"{nb.stem}.html").read_text(encoding="utf-8"))
                or app_summary(nb))
               for nb in nbs if (site / f"{nb.stem}.html").exists()]
    if offline:
        make_offline(site, [e[0] for e in entries])
    write_index(site, entries)
    return results
