# The Python SDK's Streamable HTTP client on argv[1] (the bridge's local
# endpoint), scenario argv[2]. Prints one `key: value` line per result.
import asyncio, sys
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

def out(k, v):
    print(f"{k}: {v}", flush=True)

def text(result):
    return result.content[0].text

async def scenario(s, mode):
    await s.initialize()
    if mode == "full":
        tools = await s.list_tools()
        out("tools", ",".join(sorted(t.name for t in tools.tools)))
        out("add", text(await s.call_tool("add", {"a": 2, "b": 40})))
        steps = []
        async def on_progress(p, total, message):
            steps.append(f"{p:g}/{total:g}")
        r = text(await s.call_tool("progress", {"steps": 5}, progress_callback=on_progress))
        out("progress", f"{r} {' '.join(steps)}")
        res = await s.read_resource("test://greeting")
        out("resource", res.contents[0].text)
        out("pid", text(await s.call_tool("pid", {})))
    elif mode == "hold":
        async def on_progress(p, total, message):
            out("tick", f"{p:g}")
        await s.call_tool("ticker", {}, progress_callback=on_progress)

async def main():
    url, mode = sys.argv[1], sys.argv[2]
    async with streamable_http_client(url) as (r, w):
        async with ClientSession(r, w) as s:
            await scenario(s, mode)
    out("end", "ok")

asyncio.run(main())
