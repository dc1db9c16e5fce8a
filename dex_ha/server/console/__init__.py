"""The web console at /ui: a page, a stylesheet, a script and an icon, served as they are.

Nothing is built: the files in `static/` are what the browser gets, so the console works
offline and needs no Node toolchain. The page itself needs no token (it asks for one and
keeps it in the tab's sessionStorage); every API call the script makes carries it, and the
API checks it as it checks any other caller's. Every node serves it: on a standby its calls
go on to the active node (dex_ha/server/forwarding.py). `GET /` leads to it.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

STATIC_DIR = Path(__file__).parent / "static"
CONSOLE_PATH = "/ui"

# The console talks only to the node that served it, and runs only its own files.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
CONTENT_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}


def add_console_routes(app: web.Application) -> None:
    """GET /ui (the page), GET /ui/static/{name} (its script, stylesheet and icon), and
    GET / (a redirect to the page: a node's bare address in a browser opens the console)."""
    app.router.add_get("/", _to_console)
    app.router.add_get(CONSOLE_PATH, _page)
    app.router.add_get(CONSOLE_PATH + "/", _page)
    app.router.add_get(CONSOLE_PATH + "/static/{name}", _static_file)


async def _to_console(request: web.Request) -> web.Response:
    raise web.HTTPFound(CONSOLE_PATH)


async def _page(request: web.Request) -> web.Response:
    return _file_response(STATIC_DIR / "index.html")


async def _static_file(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    # Only the files that ship, by name: no path from the URL reaches the file system.
    shipped = {path.name: path for path in STATIC_DIR.iterdir() if path.suffix in CONTENT_TYPES}
    if name not in shipped:
        raise web.HTTPNotFound()
    return _file_response(shipped[name])


def _file_response(path: Path) -> web.Response:
    return web.Response(
        body=path.read_bytes(), headers=SECURITY_HEADERS, content_type=CONTENT_TYPES[path.suffix], charset="utf-8"
    )
