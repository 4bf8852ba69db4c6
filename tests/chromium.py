"""Headless Chromium driven over its own DevTools protocol (a websocket, aiohttp's client): no driver, no
browser download. Tests use ``find_chromium()`` and ``Chromium``; run as a script it screenshots a page:

    python -m tests.chromium http://127.0.0.1:8770/ docs/dashboard.png [--width 1280 --height 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--mute-audio", "--remote-debugging-port=0", "--remote-allow-origins=*"]


REQUIRE_ENV = "SWARM_NODE_REQUIRE_CHROMIUM"  # set by .ci/run: there a missing Chromium fails, never skips


def find_chromium() -> str | None:
    """Debian's ``chromium`` (or another name a distribution uses), or None."""
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium_or_skip() -> str:
    """The Chromium executable; else the test is skipped, saying why, or fails where ``$SWARM_NODE_REQUIRE_CHROMIUM``
    is set (CI installed it with ``scripts/dev/ci_deps.sh``, so a missing one is a broken set-up, not a skip)."""
    import pytest

    exe = find_chromium()
    if exe is None:
        why = "no Chromium on this machine (Debian: apt-get install chromium, or run scripts/dev/ci_deps.sh as root)"
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{why}, and {REQUIRE_ENV} is set")
        pytest.skip(why)
    return exe


class CdpError(Exception):
    pass


class Page:
    """One tab, attached with a flat session."""

    def __init__(self, browser: Chromium, session_id: str) -> None:
        self.browser = browser
        self.session_id = session_id

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.browser.send(method, params, session_id=self.session_id)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (promises awaited)."""
        reply = await self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                     "awaitPromise": True})
        if "exceptionDetails" in reply:
            raise CdpError(f"{expression!r} threw: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 60.0) -> Any:
        """Poll until ``expression`` is truthy (errors while the page loads count as not yet); returns it. The
        pages come from nodes that are training, on a machine that may be loaded: a CI run beside a lab run once
        needed more than 20 s, so the bound is a minute, a wait that only a real failure reaches."""
        deadline = time.monotonic() + timeout
        error: CdpError | None = None
        while True:
            try:
                value = await self.evaluate(expression)
                if value:
                    return value
            except CdpError as exc:  # e.g. document.body is null before the page is parsed
                error = exc
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression!r} still falsy after {timeout:.0f} s (last error: {error})")
            await asyncio.sleep(0.1)

    async def screenshot(self, path: str | Path) -> Path:
        reply = await self.send("Page.captureScreenshot", {"format": "png"})
        out = Path(path)
        out.write_bytes(base64.b64decode(reply["data"]))
        return out


class Chromium:
    """``async with Chromium(exe) as browser: page = await browser.open(url)``; always cleaned up."""

    def __init__(self, executable: str, startup_timeout: float = 30.0) -> None:
        self.executable = executable
        self.startup_timeout = startup_timeout
        self.exceptions: list[dict[str, Any]] = []  # JavaScript errors thrown in any page
        self._profile = Path(tempfile.mkdtemp(prefix="swarm-node-chromium-"))
        self._proc: subprocess.Popen[bytes] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._next_id = 0

    async def __aenter__(self) -> Chromium:
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def _start(self) -> None:
        log = open(self._profile / "chromium.log", "wb")  # noqa: SIM115 -- closed right after Popen took it
        with log:
            self._proc = subprocess.Popen([self.executable, *FLAGS, f"--user-data-dir={self._profile / 'data'}",
                                           "about:blank"], stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        port_file = self._profile / "data" / "DevToolsActivePort"  # Chromium writes the port it bound here
        deadline = time.monotonic() + self.startup_timeout
        while not (port_file.is_file() and len(port_file.read_text().split()) >= 2):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                tail = (self._profile / "chromium.log").read_text(errors="replace")[-1500:]
                raise CdpError(f"chromium did not start (exit {self._proc.poll()}): {tail}")
            await asyncio.sleep(0.05)
        port, path = port_file.read_text().split()[:2]
        self._http = aiohttp.ClientSession()
        self._ws = await self._http.ws_connect(f"ws://127.0.0.1:{port}{path}", max_msg_size=0)
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self._ws is not None
        async for msg in self._ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            if "id" in data:
                fut = self._pending.pop(data["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(data)
            elif data.get("method") == "Runtime.exceptionThrown":
                self.exceptions.append(data["params"]["exceptionDetails"])
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(CdpError("the DevTools connection closed"))

    async def send(self, method: str, params: dict[str, Any] | None = None, *, session_id: str | None = None,
                   timeout: float = 30.0) -> dict[str, Any]:
        if self._ws is None:
            raise CdpError("not connected")
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session_id is not None:
            message["sessionId"] = session_id
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[self._next_id] = fut
        await self._ws.send_str(json.dumps(message))
        try:
            reply = await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:  # named, so a failure says which command the browser did not answer
            self._pending.pop(message["id"], None)
            raise CdpError(f"{method}: no answer within {timeout:.0f} s") from None
        if "error" in reply:
            raise CdpError(f"{method}: {reply['error']}")
        return dict(reply.get("result", {}))

    async def open(self, url: str, width: int = 1280, height: int = 1000) -> Page:
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
        page = Page(self, attached["sessionId"])
        await page.send("Runtime.enable")
        await page.send("Page.enable")
        await page.send("Emulation.setDeviceMetricsOverride",
                        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        await page.send("Page.navigate", {"url": url})
        return page

    async def close(self) -> None:
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.send("Browser.close"), 5.0)
            await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        if self._http is not None:
            await self._http.close()
        if self._proc is not None:
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        shutil.rmtree(self._profile, ignore_errors=True)


async def _screenshot(url: str, out: str, width: int, height: int, wait: str) -> None:
    exe = find_chromium()
    if exe is None:
        raise SystemExit("no chromium found (Debian: apt-get install chromium)")
    async with Chromium(exe) as browser:
        page = await browser.open(url, width, height)
        await page.wait_for(wait)
        await asyncio.sleep(0.5)  # let the charts finish drawing
        print(await page.screenshot(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url")
    parser.add_argument("out")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=1000)
    parser.add_argument("--wait", default="document.body.dataset.loaded", help="JS expression to wait for")
    args = parser.parse_args()
    asyncio.run(_screenshot(args.url, args.out, args.width, args.height, args.wait))


if __name__ == "__main__":
    main()
