#!/usr/bin/env python3
"""Screenshot notebooks as a reader sees them: `marimo edit` in headless Chromium, after a real run.

Each notebook runs in a fresh `marimo edit` server (the project's `auto_instantiate = true` runs
it on open). The script waits until no cell is running or queued and the page has stopped
changing, then writes the whole notebook as numbered pieces (`<nb>-01.png`, `<nb>-02.png`, ...).

    .venv/bin/python scripts/screenshot_notebooks.py notebooks/resnet.py --out /tmp/shots --smoke
    .venv/bin/python scripts/screenshot_notebooks.py --out /tmp/shots       # every notebook
    .venv/bin/python scripts/screenshot_notebooks.py --site site --out /tmp/shots   # the site

`--site DIR` shoots the static site `tpu-workbench docs` wrote, page by page, as a workshop
attendee reads it: served over HTTP on loopback, every other request blocked (it must need
no internet), nothing run.

Two traps it avoids:
- `marimo edit` shows the last session snapshot (`notebooks/__marimo__/session/`) as outputs
  before the kernel has run. Each server keeps its snapshots in its own empty temporary folder
  (see LAUNCH), so the checkout's snapshots are neither shown nor touched, and several runs of
  this script at once do not see each other's.
- marimo's page scrolls inside an element, not the window, so a "full page" screenshot is one
  viewport. The viewport is grown to the scrolling element's full height instead.

`bench_notebooks.py` reuses `marimo_edit`, `browser` and `wait_idle` from here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROME_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WIDTH, PIECE = 1200, 1600
# Starts marimo's CLI with its session snapshots sent to a private, empty folder: the server
# reads and writes them through this one function (marimo 0.25), so the page shows only what
# this run computes and the checkout's notebooks/__marimo__/session/ is neither read nor touched.
LAUNCH = ("import pathlib, sys; import marimo._session.state.serialize as s; "
          "snaps = pathlib.Path(sys.argv.pop(1)); "
          "s.get_session_cache_file = lambda p: snaps / (pathlib.Path(p).name + '.json'); "
          "sys.argv[0] = 'marimo'; from marimo._cli.cli import main; main()")

# Busy = a cell shows marimo's running or queued status icon (data-testid="cell-status").
JS_BUSY = """() => document.querySelectorAll(
  '[data-testid="cell-status"][data-status="running"],'
  + '[data-testid="cell-status"][data-status="queued"]').length"""
# What "the page changed" means: text, charts drawn and height of the scrolling element.
JS_SIGNATURE = """() => {
  const charts = document.querySelectorAll('.vega-embed canvas, .vega-embed svg').length;
  return [document.body.innerText.length, charts, window.__scroller().scrollHeight].join('/');
}"""
# marimo's app scrolls inside an element: the nearest scrolling ancestor of the cells (falls
# back to the page). Never a scroll box inside an output (a long <pre> with max-height): picking
# the element with most hidden overflow chose such a box once the page fitted the viewport, and
# every growth of the viewport then added the box's hidden height again, blank screens at the end.
JS_SCROLLER = """() => { window.__scroller = () => {
  const cell = document.querySelector('.marimo-cell');
  for (let el = cell && cell.parentElement; el; el = el.parentElement) {
    const oy = getComputedStyle(el).overflowY;
    if (oy === 'auto' || oy === 'scroll') return el;
  }
  return document.scrollingElement; }; }"""
JS_HEIGHTS = "() => [window.__scroller().scrollHeight, window.__scroller().clientHeight]"
# Where the last cell ends, in page pixels: below it is marimo's own chrome (the add-cell bar),
# and blank space where outputs got shorter after the viewport grew (the viewport never
# shrinks back), so the screenshot is cut there.
JS_CELLS_BOTTOM = """() => Math.max(0, ...Array.from(document.querySelectorAll('.marimo-cell'),
  el => el.getBoundingClientRect().bottom))"""
JS_ERRORS = "() => document.querySelectorAll('.marimo-cell.has-error').length"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def marimo_edit(notebook: Path, env: dict[str, str]):
    """A `marimo edit NOTEBOOK` server on a free port, with no stale session snapshot.
    Yields its URL; on exit stops the server, its kernel and the kernel's workers."""
    snapshots = Path(tempfile.mkdtemp(prefix="tpu-workbench-snapshots-"))
    port = _free_port()
    url = f"http://127.0.0.1:{port}/"
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCH, str(snapshots), "-y", "edit", str(notebook.resolve()),
         "--headless", "--no-token", "--no-sandbox", "--port", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(url, timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"marimo edit {notebook.name} did not start") from None
                time.sleep(0.2)
        yield url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the whole session: server, kernel, workers
            proc.wait(timeout=30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(snapshots, ignore_errors=True)


@contextmanager
def browser():
    """Debian Chromium under Playwright."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROME_ARGS)
        try:
            yield b
        finally:
            b.close()


def wait_idle(page, timeout_s: float, settle_s: float = 2.0, saw_busy: bool = False) -> float:
    """Wait until a run has happened, no cell is running or queued, and the page has been
    unchanged for `settle_s`. Returns the monotonic time the page went idle.

    Cells are idle before the kernel starts too, so "idle" counts only after some cell was seen
    busy (or, if a run was too quick to catch, after 20 s of an unchanged idle page)."""
    page.evaluate(JS_SCROLLER)
    start = time.monotonic()
    deadline = start + timeout_s
    last_sig, idle_since, report = None, None, start + 30
    while time.monotonic() < deadline:
        busy = page.evaluate(JS_BUSY)
        sig = page.evaluate(JS_SIGNATURE)
        now = time.monotonic()
        if now > report:
            print(f"  ... {now - start:.0f} s: {busy} cell(s) running or queued; page {sig}",
                  file=sys.stderr, flush=True)
            report = now + 30
        saw_busy = saw_busy or busy > 0
        if busy:
            idle_since = None
        elif sig != last_sig or idle_since is None:
            idle_since = now
        elif now - idle_since >= (settle_s if saw_busy else 20.0):
            return idle_since
        last_sig = sig
        page.wait_for_timeout(100)
    raise TimeoutError(f"cells still running after {timeout_s:.0f} s")


def shoot(page, out: Path, stem: str) -> list[Path]:
    """Grow the viewport to the notebook's full height, screenshot, cut into PIECE-px pieces
    down to the last cell's end."""
    from PIL import Image

    page.evaluate(JS_SCROLLER)
    for _ in range(6):  # outputs may reflow at a new height: repeat until it fits
        full, visible = page.evaluate(JS_HEIGHTS)
        height = page.viewport_size["height"]
        if full <= visible:
            break
        page.set_viewport_size({"width": WIDTH, "height": height + full - visible})
        page.wait_for_timeout(500)
    whole = out / f"{stem}-full.png"
    page.screenshot(path=str(whole))
    bottom = int(page.evaluate(JS_CELLS_BOTTOM)) + 40
    paths = []
    with Image.open(whole) as img:
        end = min(img.height, bottom) if bottom > 40 else img.height
        for i, top in enumerate(range(0, end, PIECE), start=1):
            path = out / f"{stem}-{i:02d}.png"
            img.crop((0, top, img.width, min(top + PIECE, end))).save(path)
            paths.append(path)
    whole.unlink()
    return paths


def screenshot(notebook: Path, out: Path, env: dict[str, str],
               timeout_s: float) -> tuple[list[Path], bool]:
    errors: list[str] = []
    with marimo_edit(notebook, env) as url, browser() as b:
        page = b.new_page(viewport={"width": WIDTH, "height": PIECE})
        page.on("pageerror", lambda e: errors.append(str(e)))
        t0 = time.monotonic()
        page.goto(url)
        idle = wait_idle(page, timeout_s)
        failed = page.evaluate(JS_ERRORS)
        for old in out.glob(f"{notebook.stem}-[0-9][0-9].png"):
            old.unlink()  # pieces of an earlier, longer screenshot
        paths = shoot(page, out, notebook.stem)
    note = f"idle after {idle - t0:.1f} s"
    if failed:
        note += f"; {failed} cell(s) with errors"
    if errors:
        note += f"; page errors: {errors[:3]}"
    print(f"{notebook.name}: {note}", file=sys.stderr)
    return paths, bool(failed or errors)


@contextmanager
def served(folder: Path):
    """`folder` served over HTTP on a free loopback port (a thread); yields its URL."""
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:  # a line per request would bury the report
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()


def shoot_site(site: Path, out: Path, pages: list[str] | None = None) -> int:
    """Screenshot every page of a static site (or `pages`, by stem); 1 where a page failed to
    draw, asked for anything off this machine, or raised a script error."""
    bad = []
    stems = pages or sorted(p.stem for p in site.glob("*.html") if p.stem != "index")
    with served(site) as url, browser() as b:
        for stem in ["index", *stems]:
            page = b.new_page(viewport={"width": WIDTH, "height": PIECE})
            outside, errors = [], []
            page.route("**/*", lambda r, outside=outside: r.continue_()
                       if r.request.url.startswith(url)
                       else (outside.append(r.request.url), r.abort()))
            page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
            page.goto(f"{url}{stem}.html")
            if stem == "index":
                page.wait_for_timeout(500)
                page.screenshot(path=str(out / "index-01.png"), full_page=True)
                paths = [out / "index-01.png"]
            else:
                page.locator(".marimo-cell").first.wait_for(timeout=120_000)
                page.wait_for_timeout(3000)  # charts and tables draw after the cells
                paths = shoot(page, out, stem)
            note = f"{len(paths)} piece(s)"
            if outside or errors:
                bad.append(stem)
                note += f"; blocked {outside[:3]}; errors {errors[:3]}"
            print(f"{stem}: {note}", file=sys.stderr)
            for path in paths:
                print(path)
            page.close()
    if bad:
        print(f"problems in: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("notebooks", nargs="*", type=Path,
                    help="notebook files (default: every notebooks/*.py)")
    ap.add_argument("--out", type=Path, required=True, help="folder for the PNG pieces")
    ap.add_argument("--smoke", action="store_true", help="set TPU_WORKBENCH_SMOKE=1 (quick runs)")
    ap.add_argument("--timeout", type=float, default=900, metavar="S",
                    help="seconds to wait for each notebook to go idle (default 900)")
    ap.add_argument("--results", type=Path,
                    help="TPU_WORKBENCH_RESULTS folder (default: a fresh temporary folder)")
    ap.add_argument("--site", type=Path,
                    help="shoot this static site's pages (`tpu-workbench docs`) instead")
    args = ap.parse_args(argv)
    if args.site is not None:
        if not (args.site / "index.html").is_file():
            ap.error(f"{args.site} holds no site (no index.html): tpu-workbench docs --out DIR")
        args.out.mkdir(parents=True, exist_ok=True)
        return shoot_site(args.site, args.out, [nb.stem for nb in args.notebooks] or None)
    # On SIGTERM (timeout, kill) unwind, so the marimo servers and their workers are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    notebooks = args.notebooks or sorted((ROOT / "notebooks").glob("*.py"))
    missing = [str(nb) for nb in notebooks if not nb.is_file()]
    if missing:
        ap.error(f"no such notebook: {', '.join(missing)}")
    if not os.path.exists(CHROMIUM):
        ap.error("chromium not found (apt-get install chromium)")
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.results or Path(tempfile.mkdtemp(prefix="tpu-workbench-shots-"))
    env = {**os.environ, "TPU_WORKBENCH_RESULTS": str(results)}
    if args.smoke:
        env["TPU_WORKBENCH_SMOKE"] = "1"
    bad = []
    for nb in notebooks:
        try:
            paths, failed = screenshot(nb, args.out, env, args.timeout)
        except (RuntimeError, TimeoutError) as e:
            print(f"{nb.name}: {e}", file=sys.stderr)
            bad.append(nb.name)
            continue
        if failed:
            bad.append(nb.name)
        for path in paths:
            print(path)
    if not args.results:
        shutil.rmtree(results, ignore_errors=True)
    if bad:
        print(f"problems in: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
