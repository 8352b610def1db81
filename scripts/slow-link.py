#!/usr/bin/env python3
"""A slow network link for the cluster demo: a TCP relay on 127.0.0.1 that carries what the
client sends at most RATE bytes a second (what the server sends goes through as it comes).
Devices on a slow uplink upload slowly; this makes one upload last long enough to kill the
node that receives it in the middle. When the server side closes or cannot be reached, the
client's connection is closed too.

    scripts/slow-link.py LISTEN_PORT_FILE TARGET_PORT RATE

Listens on a free port and writes it to LISTEN_PORT_FILE; runs until killed.
"""
import asyncio
import sys
import time


async def pump(reader, writer, rate):
    budget, last = 0.0, time.monotonic()
    try:
        while True:
            data = await reader.read(16384)
            if not data:
                break
            if rate:
                # A token bucket: at most `rate` bytes a second, in bursts of at most a quarter second.
                now = time.monotonic()
                budget = min(rate / 4, budget + (now - last) * rate)
                last = now
                budget -= len(data)
                if budget < 0:
                    await asyncio.sleep(-budget / rate)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def main():
    port_file, target, rate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

    async def handle(client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(pump(client_reader, server_writer, rate), pump(server_reader, client_writer, 0))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    with open(port_file, "w") as f:
        f.write(str(server.sockets[0].getsockname()[1]))
    async with server:
        await server.serve_forever()


asyncio.run(main())
