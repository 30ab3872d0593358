"""A TCP forwarder for outage tests: 127.0.0.1:<port> reaches a real endpoint of the embedded stack while
up, and is refused (nobody listening, open connections cut) while down, like a dependency that restarts."""

from __future__ import annotations

import asyncio


class Forwarder:
    def __init__(self, target_host: str, target_port: int, port: int = 0) -> None:
        self.target, self.port = (target_host, target_port), port
        self.server: asyncio.Server | None = None
        self.open: set[asyncio.StreamWriter] = set()

    async def up(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def down(self) -> None:
        if self.server is None:
            return
        self.server.close()
        for writer in list(self.open):
            writer.close()
        await self.server.wait_closed()
        self.server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.open |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            finally:
                dst.close()
                self.open.discard(dst)

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)
