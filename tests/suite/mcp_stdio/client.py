# The Python SDK's stdio client, started on the bridge: argv[1] the bridge,
# argv[2] its arguments as JSON, argv[3] the scenario. Prints one
# `key: value` line per result.
import asyncio, json, os, sys, time
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

def out(k, v):
    print(f"{k}: {v}", flush=True)

def text(result):
    return result.content[0].text

async def scenario(s, mode, extra):
    await s.initialize()
    if mode == "full":
        tools = await s.list_tools()
        out("tools", ",".join(sorted(t.name for t in tools.tools)))
        out("add", text(await s.call_tool("add", {"a": 2, "b": 40})))
        n = 1024 * 1024
        b = text(await s.call_tool("big", {"n": n}))
        want = "".join(chr(ord("a") + i % 26) for i in range(n))
        out("big", f"{len(b)} {b == want}")
        steps = []
        async def on_progress(p, total, message):
            steps.append(f"{p:g}/{total:g}")
        r = text(await s.call_tool("progress", {"steps": 5}, progress_callback=on_progress))
        out("progress", f"{r} {' '.join(steps)}")
        res = await s.read_resource("test://greeting")
        out("resource", res.contents[0].text)
        # Pipelined calls answered in any order, each once.
        rs = await asyncio.gather(*(s.call_tool("add", {"a": i, "b": 1}) for i in range(50)))
        out("pipelined", all(text(r) == str(i + 1) for i, r in enumerate(rs)))
    elif mode == "crash":
        try:
            r = await asyncio.wait_for(s.call_tool("crash", {}), 30)
            out("crash", f"answered {r}")
        except Exception as e:
            out("crash", f"error {type(e).__name__} {e}")
    elif mode == "sandbox":
        out("write", text(await s.call_tool("write_file", {"path": extra["path"]})))
        out("connect", text(await s.call_tool("connect", {"host": "127.0.0.1", "port": extra["port"]})))
    elif mode == "big":
        n = extra["n"]
        b = text(await s.call_tool("big", {"n": n}))
        want = "".join(chr(ord("a") + i % 26) for i in range(n))
        out("big", f"{len(b)} {b == want}")
    elif mode == "pipelined":
        # All issued at once; each answer matched to its request by id.
        n = extra["n"]
        rs = await asyncio.gather(*(s.call_tool("add", {"a": i, "b": 1}) for i in range(n)))
        out("pipelined", f"{len(rs)} {sum(text(r) == str(i + 1) for i, r in enumerate(rs))}")
    elif mode == "calls":
        # extra["calls"]: [[tool, arguments], ...]; each result as JSON.
        for i, (tool, args) in enumerate(extra["calls"]):
            r = await s.call_tool(tool, args)
            out(f"call{i}", json.dumps({"error": bool(getattr(r, "is_error", None) or getattr(r, "isError", False)), "text": text(r)}))
    elif mode == "numbered":
        # Numbered progress notifications while batches of calls go the
        # other way (a tick and four adds at once); the first notification
        # is announced (the test drops the transport then). Each number and
        # each call must come exactly once, each answer the right one.
        out("pid", text(await s.call_tool("pid", {})))
        seen = []
        async def on_progress(p, total, message):
            seen.append(int(p))
            if len(seen) == 1:
                out("streaming", "1")
        count = extra["count"]
        call = asyncio.ensure_future(
            s.call_tool("numbered", {"count": count, "delay": extra["delay"]},
                        progress_callback=on_progress))
        sent, counts, adds_right = 0, [], True
        while not call.done():
            adds = [s.call_tool("add", {"a": sent * 10 + i, "b": 1}) for i in range(4)]
            rs = await asyncio.gather(s.call_tool("tick", {}), *adds)
            counts.append(int(text(rs[0])))
            adds_right &= all(text(r) == str(sent * 10 + i + 1) for i, r in enumerate(rs[1:]))
            sent += 1
            await asyncio.sleep(extra["delay"])
        r = text(await call)
        out("numbered", f"{r} {len(seen)} {seen == list(range(1, count + 1))}")
        # Sent, received by the server, distinct ids received.
        out("ticks", f"{sent} {text(await s.call_tool('ticks', {}))}")
        # Tick k answered k (the server counted each once), every add right.
        out("answers", f"{counts == list(range(1, sent + 1))} {adds_right}")
    elif mode == "hold":
        out("pid", text(await s.call_tool("pid", {})))
        await asyncio.sleep(3600)

async def main():
    bridge, args, mode = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    params = StdioServerParameters(command=bridge, args=args, env=dict(os.environ))
    started = time.monotonic()
    try:
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await scenario(s, mode, extra)
    except BaseException as e:
        if mode != "crash":
            raise
        out("closing", f"{type(e).__name__}")
    out("elapsed", f"{time.monotonic() - started:.1f}")
    out("end", "ok")

asyncio.run(main())
