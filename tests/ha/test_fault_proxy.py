"""The fault proxy itself (harness/fault_proxy.py), against a local echo server: an
open link forwards both ways; a cut link forwards nothing on open connections and answers
no new one; healing closes what the cut held and forwards new connections; a cut with
close resets open connections at once; links are independent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from harness.fault_proxy import ProxyMesh

SHORT_S = 0.3  # long enough to see that nothing arrives


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1024):
        writer.write(data)
        await writer.drain()
    writer.close()


@pytest.fixture
async def mesh() -> AsyncIterator[ProxyMesh]:
    servers = [await asyncio.start_server(echo, "127.0.0.1", 0) for _ in range(2)]
    ports = {f"n{i}": s.sockets[0].getsockname()[1] for i, s in enumerate(servers)}
    proxies = ProxyMesh(ports)
    await proxies.start()
    try:
        yield proxies
    finally:
        await proxies.stop()
        for server in servers:
            server.close()


async def dial(mesh: ProxyMesh, src: str, dst: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = mesh.address(src, dst).split(":")
    return await asyncio.open_connection(host, int(port))


async def roundtrip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> bytes | None:
    """What comes back for `data` within SHORT_S (None: nothing; b"": closed)."""
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(1024), SHORT_S)
    except TimeoutError:
        return None
    except ConnectionResetError:
        return b""


async def test_a_cut_link_holds_then_heals(mesh: ProxyMesh) -> None:
    reader, writer = await dial(mesh, "n0", "n1")
    assert await roundtrip(reader, writer, b"hello") == b"hello"
    await mesh.cut([("n0", "n1")])
    assert await roundtrip(reader, writer, b"lost") is None  # held: no answer, no close
    new_reader, new_writer = await dial(mesh, "n0", "n1")  # accepted, but a black hole
    assert await roundtrip(new_reader, new_writer, b"void") is None
    back_reader, back_writer = await dial(mesh, "n1", "n0")  # the other direction is another link
    assert await roundtrip(back_reader, back_writer, b"other way") == b"other way"

    await mesh.heal()
    assert await asyncio.wait_for(reader.read(1024), 5) == b""  # what the cut held is closed
    reader, writer = await dial(mesh, "n0", "n1")
    assert await roundtrip(reader, writer, b"again") == b"again"
    for w in (writer, new_writer, back_writer):
        w.close()


async def test_a_cut_with_close_resets_open_connections(mesh: ProxyMesh) -> None:
    reader, writer = await dial(mesh, "n0", "n1")
    assert await roundtrip(reader, writer, b"hello") == b"hello"
    await mesh.isolate("n1", close=True)
    assert await asyncio.wait_for(reader.read(1024), 5) == b""
    writer.close()


async def test_a_delayed_link_forwards_late_in_order_and_fast_again_after(mesh: ProxyMesh) -> None:
    reader, writer = await dial(mesh, "n0", "n1")
    assert await roundtrip(reader, writer, b"warm") == b"warm"
    await mesh.delay([("n0", "n1")], SHORT_S * 2)
    assert await roundtrip(reader, writer, b"slow") is None  # not within SHORT_S: it waits
    assert await asyncio.wait_for(reader.read(1024), 5) == b"slow"  # late, but it arrives
    back_reader, back_writer = await dial(mesh, "n1", "n0")  # the other direction is another link
    assert await roundtrip(back_reader, back_writer, b"quick") == b"quick"

    await mesh.delay([("n0", "n1")], 0)
    assert await roundtrip(reader, writer, b"fast") == b"fast"
    for w in (writer, back_writer):
        w.close()
